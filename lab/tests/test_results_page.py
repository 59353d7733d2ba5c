"""`hoplab results-page`: the report's opening table as a page of its own, on the full
report of 2026-11-28 kept in docs/reports."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hoplab import cli
from hoplab.reproduce import report

REPORT = Path(__file__).resolve().parents[2] / "docs" / "reports" / "2026-11-28-full" / "report.json"

needs_report = pytest.mark.skipif(not REPORT.exists(), reason=f"{REPORT} not in this checkout")


def opening_table(md: str) -> list[str]:
    """The table lines of report.md's first section."""
    section = md.split("## The papers' figures at a glance", 1)[1].split("\n## ", 1)[0]
    return [ln for ln in section.splitlines() if ln.startswith("|")]


@needs_report
def test_the_page_has_the_reports_opening_table_and_names_the_report():
    rep = json.loads(REPORT.read_text())
    page = report.results_page(rep, "docs/reports/2026-11-28-full/report.json")
    first = page.splitlines()[0]
    assert first.startswith("Generated from docs/reports/2026-11-28-full/report.json")
    rows = [ln for ln in page.splitlines() if ln.startswith("|")]
    assert rows == opening_table(report.markdown(rep))
    with_figure = sum(1 for e in rep["experiments"] for r in e["rows"] if r["paper"] is not None or r["paper_range"])
    assert len(rows) == with_figure + 2 and with_figure > 100
    assert rows[0] == "| experiment | figure | ours [95 % CI] (n) | paper | ours/paper |"
    assert any(r.startswith("| hop-5.1 | median goodput, Hop / TCP | 1.27× [1.27, 3.54] (n=4) | 1.6× |")
               for r in rows)


@needs_report
def test_the_command_writes_a_new_or_generated_page_and_leaves_a_written_one(tmp_path, capsys):
    out = tmp_path / "results.md"
    assert cli.main(["results-page", str(REPORT.parent), "--out", str(out)]) == 0
    assert out.read_text().startswith(f"Generated from {REPORT}")
    out.write_text("Generated from an older report\n")
    assert cli.main(["results-page", str(REPORT), "--out", str(out)]) == 0
    assert out.read_text().startswith(f"Generated from {REPORT}")
    hand = tmp_path / "hand.md"
    hand.write_text("# Results\n\nwritten by hand\n")
    assert cli.main(["results-page", str(REPORT), "--out", str(hand)]) == 2
    assert hand.read_text() == "# Results\n\nwritten by hand\n"
    assert "not a generated page" in capsys.readouterr().err
    assert cli.main(["results-page", str(REPORT)]) == 0
    assert capsys.readouterr().out.startswith(f"Generated from {REPORT}")


def test_a_report_without_paper_figures_gets_a_page_that_says_so():
    rep = {"meta": {"preset": "quick", "date": "d", "commit": "c"}, "ci_method": "m",
           "experiments": [{"id": "x", "rows": [{"paper": None, "paper_range": None}]}]}
    page = report.results_page(rep, "r.json")
    assert page.startswith("Generated from r.json") and "No row of this report" in page
    assert report.headline_table(rep) == []
