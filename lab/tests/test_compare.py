"""`hoplab compare`: matching two reports' rows, ratios and interval overlap (no emulation)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hoplab import cli
from hoplab import compare as cmp
from hoplab.errors import LabError


def row(what: str, ours, ci=None, point=None, status="ok", note=None, n=3, unit="x", paper=2.0) -> dict:
    return {"what": what, "ours": ours, "ci": ci, "point": point, "status": status, "note": note, "n": n,
            "unit": unit, "paper": paper, "paper_range": None}


def report(rows: dict[str, list[dict]], commit: str) -> dict:
    return {"meta": {"date": "d", "commit": commit, "machine": "m"},
            "experiments": [{"id": k, "rows": v} for k, v in rows.items()]}


OLD = report({"e1": [row("a / b", 1.0, [0.9, 1.1]), row("a / b", 2.0, [1.5, 2.5], point=4),
                     row("only old", 1.0)],
              "e2": [row("c / d", 1.0, [0.8, 1.2]), row("gone", None, status="no valid runs",
                                                           note="every run excluded")]}, "aaa")
NEW = report({"e1": [row("a / b", 1.5, [1.2, 1.8]), row("a / b", 2.2, [2.0, 2.4], point=4)],
              "e2": [row("c / d", 1.1, [1.0, 1.3]), row("gone", 3.0, [2.0, 4.0]), row("only new", 5.0)]},
             "bbb")


def by_key(rows):
    return {(r["experiment"], r["what"], r["point"]): r for r in rows}


def test_rows_are_matched_by_experiment_figure_and_point():
    rows = by_key(cmp.compare(OLD, NEW))
    assert rows[("e1", "a / b", None)]["new_over_old"] == pytest.approx(1.5)
    assert rows[("e1", "a / b", "4")]["new_over_old"] == pytest.approx(1.1)
    assert rows[("e1", "a / b", None)]["intervals"] == "apart"
    assert rows[("e1", "a / b", "4")]["intervals"] == "overlap"
    assert rows[("e2", "c / d", None)]["intervals"] == "overlap"


def test_rows_of_one_report_or_without_a_figure_keep_the_reason_and_no_ratio():
    rows = by_key(cmp.compare(OLD, NEW))
    assert rows[("e1", "only old", None)]["new"] == "not in report"
    assert rows[("e2", "only new", None)]["old"] == "not in report"
    gone = rows[("e2", "gone", None)]
    assert gone["old"] == "no valid runs: every run excluded"
    assert gone["new_over_old"] is None and gone["intervals"] == "—"
    assert len(rows) == 6


def test_an_undefined_figure_keeps_its_note():
    old = report({"e": [row("z / y", None, note="undefined: both figures are 0", n=1)]}, "a")
    new = report({"e": [row("z / y", 2.0, n=1)]}, "b")
    (r,) = cmp.compare(old, new)
    assert r["old"] == "— (undefined: both figures are 0; n=1)" and r["new_over_old"] is None


def test_apart_keeps_only_rows_whose_intervals_do_not_overlap():
    rows = cmp.compare(OLD, NEW, only_apart=True)
    assert [(r["experiment"], r["what"], r["point"]) for r in rows] == [("e1", "a / b", None)]


def test_markdown_names_both_reports_and_counts_the_rows(capsys, tmp_path: Path):
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "report.json").write_text(json.dumps(OLD))
    (tmp_path / "new.json").write_text(json.dumps(NEW))
    assert cli.main(["compare", str(tmp_path / "old"), str(tmp_path / "new.json")]) == 0
    out = capsys.readouterr().out
    assert "commit aaa" in out and "commit bbb" in out
    assert "| e1 | a / b (4) | 2× | 2× [1.5, 2.5] (n=3) | 2.2× [2, 2.4] (n=3) | 1.1× | overlap |" in out
    assert out.strip().endswith("6 rows; 1 with intervals apart.")


def test_a_file_that_is_not_a_report_is_a_clear_error(tmp_path: Path, capsys):
    bad = tmp_path / "runs.json"
    bad.write_text("[]")
    with pytest.raises(LabError, match="not a report.json"):
        cmp.load_report(bad)
    assert cli.main(["compare", str(bad), str(tmp_path / "missing.json")]) == 2
    assert "hoplab: error:" in capsys.readouterr().err
