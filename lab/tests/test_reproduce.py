"""`hoplab reproduce` aggregation: statistics, confidence intervals, the paper table, ratios
and the accounting of invalid runs, on synthetic run records (no emulation)."""

from __future__ import annotations

import json as _json
import random
import tempfile
from pathlib import Path

import pytest

from hoplab import fmt, spec as specmod
from hoplab.errors import LabError, SpecError
from hoplab.experiments import registry
from hoplab.experiments.base import Experiment, Scale, Variant, apply_variant
from hoplab.reproduce import cli as rcli, paper, report, runner, stats, tables


def flow(label: str, gp: float, hops: int = 1, completion: float | None = None, **kw) -> dict:
    return {"label": label, "goodput_mbps": gp, "hops": hops, "completion_s": completion,
            "start_offset": kw.pop("start", 0.0), "driver": kw.pop("driver", "tcp"), **kw}


def rec(variant: str, rep: int, flows: list[dict], status: str = "valid", point=None) -> dict:
    return {"experiment": "x", "variant": variant, "point": point, "rep": rep, "status": status,
            "flows": flows, "duration": 30.0, "reason": None if status == "valid" else "max lag 101 ms",
            "totals": {"retries": 10, "mac_tx": 100, "phy_rx_collision": 3, "final_failures": 1}}


def dummy_experiment() -> Experiment:
    return Experiment("x", "test", "hop", "none", [Variant("a", "A", {"driver": "tcp"}),
                                                   Variant("b", "B", {"driver": "udp"})],
                      build=lambda e, v, p, r, params: {}, full=Scale(reps=3, points=[None]))


def test_jain_and_hop_weighted_jain():
    assert stats.jain([1.0, 1.0, 1.0]) == pytest.approx(1.0)
    assert stats.jain([1.0, 0.0, 0.0, 0.0]) == pytest.approx(0.25)
    # Hop §5.3.2: x_i * h_i; a 2-hop flow at half the rate of a 1-hop flow is fair.
    assert stats.jain_hop_weighted([2.0, 1.0], [1, 2]) == pytest.approx(1.0)
    assert stats.jain_hop_weighted([1.0, 1.0], [1, 3]) == pytest.approx(16 / 20)
    assert stats.jain([]) is None


def test_mos_bounds_and_monotonic():
    good = stats.mos(0.0, 20.0)
    assert 4.3 < good < 4.5  # the E-model's ceiling for G.711 without loss
    assert stats.mos(0.05, 20.0) < good
    assert stats.mos(0.0, 400.0) < good
    assert stats.mos(1.0, 20.0) >= 1.0
    assert stats.mos(None, 20.0) is None


def test_voip_statistics_average_the_runs_voice_stream():
    def run(loss, clp, delay):
        return {"flows": [{"label": "m0", "goodput_mbps": 1.0},
                          {"label": "voip", "driver": "voip", "voip_loss": loss, "voip_clp": clp,
                           "delay_ms_p50": delay}]}
    runs = [run(0.10, 0.2, 10.0), run(0.30, 0.4, 30.0), {"flows": [{"label": "m0", "goodput_mbps": 1.0}]}]
    assert stats.stat_fn("voip_loss")(runs, "m") == pytest.approx(0.20)
    assert stats.stat_fn("clp")(runs, "m") == pytest.approx(0.30)
    assert stats.stat_fn("mos")(runs, "m") == pytest.approx((stats.mos(0.10, 10.0) + stats.mos(0.30, 30.0)) / 2)
    assert stats.stat_fn("voip_loss")(runs[2:], "m") is None


def test_bootstrap_ci_covers_the_mean_of_normal_samples():
    """95 % CI of a mean from 30 normal samples: about mean +- 1.96 sigma / sqrt(n)."""
    rng = random.Random(7)
    xs = [rng.gauss(10.0, 2.0) for _ in range(30)]
    m = sum(xs) / len(xs)
    ci = stats.bootstrap_ci([[x] for x in xs], lambda gs: sum(g[0] for g in gs) / len(gs))
    assert ci is not None and ci[0] < m < ci[1]
    half = (ci[1] - ci[0]) / 2
    sd = (sum((x - m) ** 2 for x in xs) / (len(xs) - 1)) ** 0.5
    assert half == pytest.approx(1.96 * sd / len(xs) ** 0.5, rel=0.25)


def test_bootstrap_ci_degenerate_cases():
    assert stats.bootstrap_ci([[1.0]], lambda gs: gs[0][0]) is None
    assert stats.bootstrap_ci([[2.0], [2.0], [2.0]], lambda gs: sum(g[0] for g in gs) / len(gs)) == (2.0, 2.0)
    # deterministic: the same input gives the same interval
    g = [[x] for x in (1.0, 5.0, 2.0, 8.0)]
    f = lambda gs: sum(x[0] for x in gs) / len(gs)  # noqa: E731
    assert stats.bootstrap_ci(g, f) == stats.bootstrap_ci(g, f)


def test_ratio_handles_zero_denominators():
    assert stats.ratio(3.0, 1.5) == 2.0
    assert stats.ratio(1.0, 0.0) == float("inf")
    assert stats.ratio(0.0, 0.0) is None
    assert stats.ratio(None, 1.0) is None


def test_paper_table_loads_and_matches_the_registry():
    rows = paper.load_paper()
    reg = registry()
    paper.check_rows(rows, reg)
    by = {(r.experiment, r.what): r for r in rows}
    # spot checks against the papers' text
    assert by[("hop-5.5", "median goodput, Hop")].value == pytest.approx(0.652)
    assert by[("hop-5.3", "hop-weighted Jain index, TCP")].value == pytest.approx(0.12)
    # a figure compared with several experiments gives one row for each
    assert by[("hop-5.3-good", "hop-weighted Jain index, TCP")].value == pytest.approx(0.12)
    assert by[("hop-5.2", "median goodput, Hop / TCP")].unit == "x"
    assert by[("hop-5.7", "goodput, DTN")].unit == "Mbit/s"
    assert all(r.value is None or r.range is None for r in rows)


def test_paper_table_rejects_bad_rows(tmp_path):
    p = tmp_path / "paper.toml"
    p.write_text('[[row]]\nexperiment = "x"\nwhat = "w"\nstat = "nope"\nvariant = "a"\nref = "r"\n')
    with pytest.raises(SpecError):
        paper.load_paper(p)
    p.write_text('[[row]]\nexperiment = "x"\nwhat = "w"\nstat = "median"\nvariant = "a"\n')
    with pytest.raises(SpecError):
        paper.load_paper(p)
    p.write_text('[[row]]\nexperiment = "nope"\nwhat = "w"\nstat = "median"\nvariant = "a"\nref = "r"\n')
    with pytest.raises(SpecError):
        paper.check_rows(paper.load_paper(p), registry())


def test_paper_row_with_an_experiment_list(tmp_path):
    p = tmp_path / "paper.toml"
    row = 'what = "w"\nstat = "median"\nvariant = "a"\nref = "r"\nvalue = 1.0\n'
    p.write_text('[[row]]\nexperiment = ["x", "y"]\n' + row)
    assert [r.experiment for r in paper.load_paper(p)] == ["x", "y"]
    for bad in ("[]", "[1]"):
        p.write_text(f"[[row]]\nexperiment = {bad}\n" + row)
        with pytest.raises(SpecError):
            paper.load_paper(p)


def test_good_route_mesh_avoids_the_lossy_bridge():
    from hoplab import routes
    from hoplab.experiments import hop_paper as hp

    # seed 1's clusters meet only across links losing most frames; the comparison mesh's
    # routes stay on links losing at most half
    assert hp.worst_route_loss(hp.mesh()) > 0.75
    good = hp.mesh(hp.GOOD_MESH_SEED)
    assert hp.GOOD_MESH_SEED != hp.MESH_SEED
    assert hp.worst_route_loss(good) <= hp.GOOD_ROUTE_MAX_LOSS
    e = registry()["hop-5.3-good"]
    d = e.spec(e.variant("hop"), 30, 0, quick=False)
    assert d["topology"]["seed"] == hp.GOOD_MESH_SEED
    table = routes.next_hops(good, "etx")
    assert len(d["flow"]) == 30
    assert all(routes.hop_count(table, f["src"], f["dst"]) >= 2 for f in d["flow"])


@pytest.mark.parametrize("short_id", ["hop-5.3", "hop-5.3-good"])
def test_thirty_minute_53_runs_the_same_flows_longer_and_is_opt_in(short_id):
    reg = registry()
    short, long = reg[short_id], reg[{"hop-5.3": "hop-5.3-30min", "hop-5.3-good": "hop-5.3-good-30min"}[short_id]]
    a = short.spec(short.variant("hop"), 30, 0, quick=False)
    b = long.spec(long.variant("hop"), 30, 0, quick=False)
    assert [(f["src"], f["dst"], f["start"]) for f in a["flow"]] == [(f["src"], f["dst"], f["start"]) for f in b["flow"]]
    assert a["topology"] == b["topology"]
    assert b["duration"] == 1800.0 and a["duration"] == 120.0
    # no flow can finish early: more than TCP's fastest 120 s flow (1.65 Mbit/s) moves in 30 min
    assert min(f["size"] for f in b["flow"]) > 1.65e6 / 8 * 1800
    assert long.opt_in and not short.opt_in


def test_weak_hub_53_runs_on_the_good_route_floor_whose_routes_meet_least_and_is_opt_in():
    from hoplab.experiments import hop_paper as hp
    reg = registry()
    e, good = reg["hop-5.3-hub"], reg["hop-5.3-good"]
    seed = hp.weakest_hub_seed()
    assert e.opt_in and seed != hp.GOOD_MESH_SEED
    assert hp.worst_route_loss(hp.mesh(seed)) <= hp.GOOD_ROUTE_MAX_LOSS
    # no good-route floor below 100 has routes meeting less in one relay
    share = hp.busiest_relay_share(hp.mesh(seed))
    assert share < hp.busiest_relay_share(hp.mesh(hp.GOOD_MESH_SEED))
    assert all(hp.busiest_relay_share(hp.mesh(s)) >= share for s in range(1, 100)
               if hp.worst_route_loss(hp.mesh(s)) <= hp.GOOD_ROUTE_MAX_LOSS)
    a = e.spec(e.variant("hop"), 30, 0, quick=False)
    assert a["topology"]["seed"] == seed and len(a["flow"]) == 30
    assert a["topology"] != good.spec(good.variant("hop"), 30, 0, quick=False)["topology"]
    # three draws of flows, Hop and TCP
    assert e.full.reps == 3 and {v.name for v in e.variants} == {"hop", "tcp"}


def test_long_partition_run_repeats_the_57_schedule_for_five_cycles_and_is_opt_in():
    reg = registry()
    short, long = reg["hop-5.7"], reg["hop-5.7-long"]
    a = short.spec(short.variant("hop-h1"), None, 0, quick=False)
    b = long.spec(long.variant("hop-h1"), None, 0, quick=False)
    assert a["topology"] == b["topology"] and a["flow"][0]["src"] == b["flow"][0]["src"]
    assert b["duration"] == 600.0 and a["duration"] == 180.0
    assert a["schedule"] == b["schedule"][:len(a["schedule"])]
    # Node 2 or node 4 is down at every instant of the run: never an end-to-end path.
    down = sorted((ev["at"], ev["node"]) for ev in b["schedule"] if ev["action"] == "down")
    assert [n for _, n in down] == [2, 4] * 5
    ups = {(ev["at"], ev["node"]) for ev in b["schedule"] if ev["action"] == "up"}
    for (t, n), (t2, _) in zip(down, down[1:] + [(600.0, None)]):
        assert (t + 60.0, n) in ups and t2 <= t + 60.0
    assert long.opt_in and not short.opt_in
    assert {v.name for v in long.variants} == {"hop-h1", "hop-h100", "dtn"}
    # The paper's Table 4 rows apply to both.
    rows = {(r.experiment, r.what) for r in paper.load_paper()}
    assert ("hop-5.7-long", "goodput, Hop H = 1") in rows and ("hop-5.7", "goodput, Hop H = 1") in rows


def test_a_run_starts_without_what_an_interrupted_attempt_left(tmp_path, monkeypatch):

    e = registry()["hop-5.7"]
    v = e.variant("hop-h1")
    run_dir = tmp_path / "runs" / "hop-5.7" / "p-" / "r0" / "hop-h1"
    stale = run_dir / "raw" / "hopd-3" / "store" / "custody" / "1-abc.blk"
    stale.parent.mkdir(parents=True)
    stale.write_bytes(b"x")
    seen = []

    def fake_run_spec(sp, out, progress=None):
        seen.append((out, stale.exists()))
        raise LabError("stopped here")

    monkeypatch.setattr(runner, "run_spec", fake_run_spec)
    rec = runner.run_one(e, v, None, 0, 0, False, tmp_path, lambda s: None)
    assert seen == [(run_dir, False)]
    assert rec["status"] == "error" and rec["dir"] == str(run_dir.relative_to(tmp_path))


def test_59_on_the_good_route_mesh_runs_53_goods_flows_with_every_routing_and_rate():
    reg = registry()
    good, e = reg["hop-5.3-good"], reg["hop-5.9-good"]
    a = good.spec(good.variant("hop"), 30, 0, quick=False)
    for v in e.variants:
        b = e.spec(v, 30, 0, quick=False)
        assert b["topology"] == a["topology"]
        assert [(f["src"], f["dst"], f["start"]) for f in b["flow"]] == [(f["src"], f["dst"], f["start"]) for f in a["flow"]]
    names = {v.name for v in e.variants}
    assert {"hop", "hop-babel", "tcp", "tcp-auto", "tcp-babel", "tcp-babel-auto"} == names
    assert e.spec(e.variant("tcp-babel-auto"), 30, 0, quick=False)["routing"] == "babel"
    assert not e.opt_in


def test_opt_in_experiments_are_listed_but_not_run_by_the_full_preset(tmp_path, monkeypatch, capsys):
    import argparse

    args = argparse.Namespace(quick=False, only=None, reps=None, points=None, out=str(tmp_path), list=True,
                              report_only=False, resume=False, retry_invalid=None)
    assert rcli.main(args) == 0
    out = capsys.readouterr().out
    preset, extra = out.split("not in the preset")
    assert "hop-5.3-30min" in extra and "hop-5.3-30min" not in preset
    assert "hop-5.3-good" in preset


def test_snapshot_of_a_run_at_a_time_from_its_progress_series():
    res = {"name": "r", "flows": [flow("m0", 9.9, hops=2, start=0.0), flow("m1", 9.9, hops=1, start=2.0)],
           "progress": {"interval_s": 2.0, "columns": ["t", "m0", "m1"],
                        "rows": [[2.0, 1000, 0], [4.1, 50_000, 0], [6.0, 100_000, 25_000]]}}
    s = runner.snapshot(res, 5.0)  # the last sample at or before 5 s
    assert s["at"] == 4.1 and s["bytes"] == 50_000 and s["empty"] == 1
    g = {f["label"]: f["goodput_mbps"] for f in s["flows"]}
    assert g["m0"] == pytest.approx(50_000 * 8 / 1e6 / 4.1) and g["m1"] == 0.0
    end = runner.snapshot(res, 60.0)
    assert end["at"] == 6.0 and end["empty"] == 0
    # goodput over the time each flow had: m1 started 2 s in
    assert {f["label"]: f["goodput_mbps"] for f in end["flows"]}["m1"] == pytest.approx(25_000 * 8 / 1e6 / 4.0)
    assert end["stats"]["jain_hw"] == pytest.approx(stats.jain_hop_weighted([100_000 * 8 / 6e6, 0.05], [2, 1]))
    with pytest.raises(LabError):
        runner.snapshot(res, 1.0)
    with pytest.raises(LabError):
        runner.snapshot({"flows": []}, 10.0)
    # a sample below an earlier one (a status not answered in time) counts the earlier one
    res["progress"]["rows"].append([8.0, 0, 30_000])
    late = runner.snapshot(res, 8.0)
    assert late["at"] == 8.0 and late["bytes"] == 130_000 and late["empty"] == 0


def test_row_value_ratio_and_invalid_runs_excluded():
    e = dummy_experiment()
    runs = [rec("a", 0, [flow("m1", 2.0), flow("m2", 4.0)]), rec("b", 0, [flow("m1", 1.0), flow("m2", 1.0)]),
            rec("a", 1, [flow("m1", 6.0), flow("m2", 6.0)]), rec("b", 1, [flow("m1", 2.0), flow("m2", 2.0)]),
            # invalid: would change every figure if it were counted
            rec("a", 2, [flow("m1", 100.0), flow("m2", 100.0)], status="invalid"),
            rec("b", 2, [flow("m1", 0.001), flow("m2", 0.001)])]
    mean_a = tables.row_result(paper.Row("x", "mean a", "mean", "a", "r", value=2.0), e, runs, {})
    assert mean_a["ours"] == pytest.approx(4.5)  # (2 + 4 + 6 + 6) / 4: the invalid run is left out
    assert mean_a["n"] == 2
    assert mean_a["ours_over_paper"] == pytest.approx(2.25)
    r = tables.row_result(paper.Row("x", "a/b", "mean", "a", "r", versus="b", value=3.0), e, runs, {})
    # pairs only from repetitions where both ran validly: rep 2 is dropped for both
    assert r["n"] == 2
    assert r["ours"] == pytest.approx(4.5 / 1.5)
    assert r["ci"] is not None and r["ci"][0] <= r["ours"] <= r["ci"][1]
    acc = tables.run_accounting(runs)
    assert acc["a"] == {"valid": 2, "invalid": 1, "error": 0, "not run": 0}


def test_row_not_run_and_no_valid_runs():
    e = dummy_experiment()
    r = tables.row_result(paper.Row("x", "a/b", "median", "a", "r", versus="b", value=1.0), e, [],
                      {"b": "dtnd not found"})
    assert r["status"] == "not run" and "dtnd" in r["note"] and r["ours"] is None
    runs = [rec("a", 0, [flow("m", 1.0)], status="invalid")]
    r = tables.row_result(paper.Row("x", "a", "median", "a", "r", value=1.0), e, runs, {})
    assert r["status"] == "no valid runs" and r["ours"] is None


def test_a_ratio_of_two_zero_figures_is_undefined_and_says_so():
    e = dummy_experiment()
    runs = [rec("a", 0, [flow("m1", 0.0), flow("m2", 0.0), flow("m3", 1.0)]),
            rec("b", 0, [flow("m1", 0.0), flow("m2", 0.0), flow("m3", 2.0)])]
    r = tables.row_result(paper.Row("x", "median a / b", "median", "a", "r", versus="b", value=2.0), e, runs, {})
    assert r["status"] == "ok" and r["ours"] is None and r["ours_over_paper"] is None
    assert r["note"] == "undefined: both figures are 0"
    rep = {"meta": {"preset": "full", "date": "d", "machine": "m", "commit": "c", "command": "x"},
           "ci_method": "bootstrap", "experiments": [{
               "id": "x", "title": "t", "ref": "r", "notes": [], "point_name": "", "variants": {"a": "A", "b": "B"},
               "runs": tables.run_accounting(runs), "invalid": [], "counters": {}, "wall_s": 60.0, "rows": [r]}]}
    line = next(ln for ln in report.markdown(rep).splitlines() if ln.startswith("| median a / b"))
    assert line == "| median a / b | r | — (undefined: both figures are 0; n=1) | 2× | — |"
    runs[0]["flows"][0]["goodput_mbps"] = runs[0]["flows"][1]["goodput_mbps"] = 1.0
    runs[1]["flows"][2]["goodput_mbps"] = 0.0
    r = tables.row_result(paper.Row("x", "median a / b", "median", "a", "r", versus="b", value=2.0), e, runs, {})
    assert r["ours"] == float("inf") and r["note"] == "infinite: the second figure is 0"
    assert _json.loads(_json.dumps(report._json_safe(r)))["ours"] is None


def test_range_rows_and_delay_statistic():
    e = dummy_experiment()
    runs = [rec("a", 0, [flow("m", 0.1, completion=6.0)]), rec("b", 0, [flow("m", 1.0, completion=1.0)]),
            rec("a", 1, [flow("m", 0.0, completion=None, start=5.0)]), rec("b", 1, [flow("m", 1.0, completion=2.0)])]
    r = tables.row_result(paper.Row("x", "delay", "delay_median", "a", "r", versus="b", range=(3.0, 15.0)), e, runs, {})
    # a: 6 s and an unfinished flow counted as 30 - 5 = 25 s -> nearest-rank median 6; b: median 1
    assert r["ours"] == pytest.approx(6.0)
    assert r["note"] == "within the paper's range"


def test_points_pool_or_select():
    e = dummy_experiment()
    runs = [rec("a", 0, [flow("m", 1.0)], point=2), rec("a", 0, [flow("m", 3.0)], point=5)]
    assert tables.row_result(paper.Row("x", "p2", "mean", "a", "r", point=2), e, runs, {})["ours"] == 1.0
    assert tables.row_result(paper.Row("x", "all", "mean", "a", "r"), e, runs, {})["ours"] == 2.0


def test_every_experiment_generates_valid_specs_with_shared_seeds():
    reg = registry()
    with tempfile.TemporaryDirectory() as td:
        for quick in (False, True):
            for e, p, rep, v in runner.plan(list(reg.values()), quick, None, diagnostics=True):
                d = runner.materialize(e.spec(v, p, rep, quick), Path(td) / e.id / v.name)
                sp = specmod.from_dict(d, Path(td))
                assert sp.seed == 1 + rep
                if e.measure == "m":
                    assert any(f.label.startswith("m") for f in sp.flows)
                    assert all(f.driver == v.driver for f in sp.flows if f.label.startswith("m"))
    # the compared protocols of one repetition get the same flows (endpoints, sizes, starts)
    e = reg["hop-5.2"]
    a, b = (e.spec(v, 3, 0, False) for v in e.variants[:2])
    strip = [{k: f[k] for k in ("src", "dst", "size")} for f in a["flow"]]
    assert strip == [{k: f[k] for k in ("src", "dst", "size")} for f in b["flow"]]
    assert a["topology"] == b["topology"]


def test_plan_and_estimate_keep_only_the_chosen_variants():
    reg = registry()
    e = reg["hop-5.2"]
    full = runner.plan([e], False, None, diagnostics=True)
    some = runner.plan([e], False, None, variants={"hop", "hop-nopipe"})
    assert {v.name for _, _, _, v in some} == {"hop", "hop-nopipe"}
    # the same points and repetitions, back to back, in the full plan's order
    assert some == [t for t in full if t[3].name in ("hop", "hop-nopipe")]
    assert e.estimate(False, None, None, {"hop"})[0] * 2 == e.estimate(False, None, None, {"hop", "tcp"})[0]
    # the ablation passes its switch to hopd
    spec = e.spec(e.variant("hop-nopipe"), 2, 0, False)
    assert spec["flow"][0]["options"]["hop"] == {"pipelining": False}
    # so does the first-frame variant, in §5.2 and on the good-route mesh, with its rows
    for eid in ("hop-5.2", "hop-5.3-good"):
        spec = reg[eid].spec(reg[eid].variant("hop-frame"), reg[eid].full.points[0], 0, False)
        assert spec["flow"][0]["options"]["hop"] == {"first_block_bytes": 0}
    rows = {(r.experiment, r.what) for r in paper.load_paper()}
    assert ("hop-5.3-good", "mean goodput, Hop with the first block from the API's first frame / Hop "
            "(not in the paper)") in rows


def test_presets_leave_the_diagnostic_variants_out_unless_asked():
    reg = registry()
    e = reg["hop-5.2"]
    papers = {"hop", "tcp", "hbhtcp", "dtn", "udp-noarq"}
    assert {v.name for v in e.variants if not v.diagnostic} == papers
    default = runner.plan([e], False, None)
    every = runner.plan([e], False, None, diagnostics=True)
    assert {v.name for _, _, _, v in default} == papers
    assert {v.name for _, _, _, v in every} == {v.name for v in e.variants}
    assert default == [t for t in every if not t[3].diagnostic]
    # a diagnostic variant named in --variants runs without --diagnostics
    assert {v.name for _, _, _, v in runner.plan([e], False, None, variants={"hop-win"})} == {"hop-win"}
    # the estimate follows the plan
    assert e.estimate(False)[0] == len(default) and e.estimate(False, diagnostics=True)[0] == len(every)
    # the quick preset's own variant list still bounds it
    assert {v.name for _, _, _, v in runner.plan([e], True, None, diagnostics=True)} == {"hop", "tcp", "udp-noarq"}
    # every figure of the papers (a row with the paper's value) compares protocols the preset runs
    for r in paper.load_paper():
        if r.value is not None or r.range is not None:
            exp = reg[r.experiment]
            assert not exp.variant(r.variant).diagnostic, (r.experiment, r.what)
            assert r.versus is None or not exp.variant(r.versus).diagnostic, (r.experiment, r.what)


def test_medium_overrides_are_checked_before_any_run():
    assert rcli.parse_medium_overrides(["link_status=true", "retry_limit=3", "standard=g"]) == {
        "link_status": True, "retry_limit": 3, "standard": "g"}
    assert rcli.parse_medium_overrides([]) == {}
    with pytest.raises(SpecError, match="unknown keys"):
        rcli.parse_medium_overrides(["link_stats=true"])
    with pytest.raises(SpecError, match="expected bool"):
        rcli.parse_medium_overrides(["link_status=3"])
    with pytest.raises(SpecError, match="KEY=VALUE"):
        rcli.parse_medium_overrides(["link_status"])


def test_apply_variant_leaves_background_flows():
    d = {"name": "n", "flow": [{"label": "m0"}, {"label": "voip", "driver": "voip"}]}
    out = apply_variant(d, Variant("hop-h100", "H", {"driver": "hop", "options": {"hop": {"backpressure_limit": 100}}}))
    assert out["flow"][0]["driver"] == "hop" and out["flow"][0]["options"]["hop"]["backpressure_limit"] == 100
    assert out["flow"][1]["driver"] == "voip" and "options" not in out["flow"][1]
    assert out["medium"]["retry_limit"] == 18


def test_unsupported_variant_is_reported(monkeypatch):
    from hoplab import dynroute
    from hoplab.experiments.base import Variant

    v = Variant("x", "X", {"driver": "tcp"}, unsupported="the lab cannot host X")
    assert runner.unavailable(v) == "the lab cannot host X"
    dyn = registry()["hop-5.9"].variant("tcp-babel")
    monkeypatch.setattr(dynroute.shutil, "which", lambda name: None)
    assert "babeld not found" in runner.unavailable(dyn)


def test_report_markdown_counts_and_not_run(tmp_path):
    e = dummy_experiment()
    runs = [dict(rec("a", 0, [flow("m", 2.0)]), loop_busy=0.42), rec("a", 1, [flow("m", 4.0)], status="invalid"),
            {"experiment": "x", "variant": "b", "point": None, "rep": 0, "status": "not run",
             "reason": "dtnd not found"}]
    rows = [paper.Row("x", "median a", "median", "a", "r", value=1.0), paper.Row("x", "a/b", "median", "a", "r", versus="b")]
    meta = {"preset": "test", "date": "d", "machine": "m", "commit": "c", "command": "cmd", "wall_min": 1.0}
    rep = report.aggregate(runs, [e], rows, tmp_path, meta, plots=False)
    md = (tmp_path / "report.md").read_text()
    assert "1 valid, 1 invalid (excluded)" in md
    assert "not run: dtnd not found" in md
    assert "excluded: a point None rep 1 attempt 0: invalid" in md
    # the valid runs' event-loop CPU share, in the counters table
    # (runs recorded before the MAC queue's drops were counted show none)
    assert "| a | 100 | 0.100 | 3 | 1 | — | 0.0 | 42 % |" in md
    with_queue = [dict(runs[0], totals=dict(runs[0]["totals"], queue_full=2, queue_expired=5))] + runs[1:]
    report.aggregate(with_queue, [e], rows, tmp_path, meta, plots=False)
    assert "| a | 100 | 0.100 | 3 | 1 | 7 | 0.0 | 42 % |" in (tmp_path / "report.md").read_text()
    assert rep["experiments"][0]["rows"][0]["ours"] == 2.0
    assert (tmp_path / "report.json").exists()
    # invalid runs that know why they lagged are counted by cause
    runs[1]["lag_cause"] = "saturated"
    runs.append(dict(rec("a", 2, [flow("m", 4.0)], status="invalid"), lag_cause="starved"))
    rep = report.aggregate(runs, [e], rows, tmp_path, meta, plots=False)
    md = (tmp_path / "report.md").read_text()
    assert "2 invalid (of them, 1 with the medium's event loop on the CPU" in md
    assert "1 with the loop waiting for the CPU) (excluded)" in md
    assert [i["cause"] for i in rep["experiments"][0]["invalid"]] == ["saturated", "starved"]


def test_rates_carry_their_unit_on_both_sides_of_0_1_mbit():
    # an interval may run from kbit/s to Mbit/s: no bare number may be left to guess
    assert fmt.figure(0.0104, "Mbit/s") == "10.4 kbit/s"
    assert fmt.figure(1.98, "Mbit/s") == "1.98 Mbit/s"
    assert fmt.figure(0.469, "Mbit/s") == "0.469 Mbit/s"
    assert fmt.figure(12.5, "Mbit/s") == "12.5 Mbit/s"
    assert fmt.figure(2.5, "x") == "2.5"
    assert fmt.figure(None, "Mbit/s") == "—"


def test_cut_off_goodput_uses_the_time_the_flow_had():
    flows = [flow("m1", 0.889, bytes=7240, size=10**7, complete=False, start=0.0),  # starved after 0.1 s
             flow("m2", 1.5, bytes=11_250_000, size=10**7 * 2, complete=False, start=0.0),
             flow("m3", 2.0, bytes=10**6, size=10**6, complete=True, start=10.0)]
    out = runner.cut_off_goodput(flows, 60.0, True)
    assert out[0]["goodput_mbps"] == pytest.approx(7240 * 8 / 1e6 / 60.0)
    assert out[0]["goodput_last_byte_mbps"] == 0.889
    assert out[1]["goodput_mbps"] == pytest.approx(1.5)
    assert out[2]["goodput_mbps"] == 2.0 and "cut_off" not in out[2]  # finished: lab's figure
    # a run that ended because every flow finished cuts nothing off
    assert runner.cut_off_goodput(flows, 60.0, False)[0]["goodput_mbps"] == 0.889
    # ... but a background flow the run did not wait for is cut off whenever it ended
    bg = [dict(flows[0], background=True)]
    assert runner.cut_off_goodput(bg, 60.0, False)[0]["goodput_mbps"] == pytest.approx(7240 * 8 / 1e6 / 60.0)


def test_run_all_repeats_invalid_runs_and_records_every_attempt(tmp_path, monkeypatch):
    e = dummy_experiment()
    e.full = Scale(reps=2, points=[None])
    statuses = iter(["invalid", "valid", "invalid", "invalid", "valid", "error"])
    calls = []

    def fake_run_one(e_, v, p, rep, attempt, quick, out, progress, medium=None):
        calls.append((v.name, rep, attempt))
        return {"experiment": e_.id, "variant": v.name, "point": p, "rep": rep, "attempt": attempt,
                "status": next(statuses), "flows": []}

    monkeypatch.setattr(runner, "run_one", fake_run_one)
    monkeypatch.setattr(runner, "unavailable", lambda v: "missing" if v.name == "b" else None)
    recs = runner.run_all([e], False, None, tmp_path, progress=lambda s: None, retry_invalid=1)
    # a: rep 0 invalid then valid; rep 1 invalid twice (gives up after one repeat); b never runs
    assert calls == [("a", 0, 0), ("a", 0, 1), ("a", 1, 0), ("a", 1, 1)]
    assert [r["status"] for r in recs if r["variant"] == "a"] == ["invalid", "valid", "invalid", "invalid"]
    assert [r["status"] for r in recs if r["variant"] == "b"] == ["not run", "not run"]
    assert tables.run_accounting(recs)["a"]["invalid"] == 3


def test_a_run_saturated_for_long_is_not_repeated(tmp_path, monkeypatch):
    e = dummy_experiment()
    e.full = Scale(reps=3, points=[None])
    lags = iter([("saturated", 0.4), ("saturated", 0.5),  # rep 0: a burst, repeated
                 ("saturated", 24.7),                    # rep 1: seconds behind, not repeated
                 ("starved", 30.0), ("saturated", 1.0)])  # rep 2: the machine's load, repeated
    calls = []

    def fake_run_one(e_, v, p, rep, attempt, quick, out, progress, medium=None):
        calls.append((rep, attempt))
        cause, behind = next(lags)
        return {"experiment": e_.id, "variant": v.name, "point": p, "rep": rep, "attempt": attempt,
                "status": "invalid", "lag_cause": cause, "behind_s": behind, "flows": []}

    monkeypatch.setattr(runner, "run_one", fake_run_one)
    monkeypatch.setattr(runner, "unavailable", lambda v: "missing" if v.name == "b" else None)
    said = []
    recs = runner.run_all([e], False, None, tmp_path, progress=said.append, retry_invalid=1)
    assert calls == [(0, 0), (0, 1), (1, 0), (2, 0), (2, 1)]
    assert any("not repeated: saturated for 24.7 s" in s for s in said)
    assert len([r for r in recs if r["variant"] == "a"]) == 5
    # --resume does not repeat it either
    calls.clear()
    lags = iter([("saturated", 0.1)] * 4)
    prev = [r for r in recs if r["variant"] == "a" and r["rep"] == 1]
    runner.run_all([e], False, None, tmp_path, progress=said.append, retry_invalid=1, previous=prev)
    assert calls == [(0, 0), (0, 1), (2, 0), (2, 1)]
    # records without the figure (older runs) are repeated as before
    assert runner.worth_repeating({"status": "invalid", "lag_cause": "saturated"})
    assert not runner.worth_repeating({"status": "valid"})


def test_plots_for_points_and_for_single_point(tmp_path):
    e = dummy_experiment()
    e.point_name = "loss"
    runs = [rec(v, r, [flow("m", g * (1 - p))], point=p) for v, g in (("a", 5.0), ("b", 3.0))
            for p in (0.0, 0.2, 0.4) for r in range(2)]
    assert report.plot_experiment(e, runs, tmp_path) == "plots/x.png"
    assert (tmp_path / "plots" / "x.png").stat().st_size > 1000
    single = [rec("a", 0, [flow("m", 1.0)]), rec("b", 0, [flow("m", 2.0)])]
    assert report.plot_experiment(e, single, tmp_path / "s") == "plots/x.png"
    assert report.plot_experiment(e, [rec("a", 0, [], status="invalid")], tmp_path / "n") is None


def test_hop_driver_finds_its_file_among_shared_receivers(tmp_path):
    """Flows to one destination share its `hop recv` clients: the small file of flow 2 may be
    taken by flow 0's client; the driver must credit it to flow 2 by the file's name."""
    import json as _json
    from types import SimpleNamespace

    from hoplab.drivers import HopDriver

    flows = [specmod.Flow(driver="hop", src=s, dst=0, size=sz) for s, sz in ((1, 10**7), (2, 10**7), (3, 4000))]
    lab = SimpleNamespace(spec=SimpleNamespace(flows=flows),
                          flow_file=lambda j, role: tmp_path / f"flow{j}-{role}.json")
    line = _json.dumps({"ok": True, "bytes": 4000, "file": "/x/hop-recv-0/hop-send-2.bin", "from": 4})
    (tmp_path / "flow0-recv.json").write_text(_json.dumps({"end": 105.0, "rc": 0, "stdout": line + "\n"}))
    (tmp_path / "flow2-send.json").write_text(_json.dumps({"start": 100.0, "rc": 0}))
    r2 = HopDriver().result(lab, flows[2], 2)
    assert r2["complete"] and r2["bytes"] == 4000 and r2["last"] == 105.0 and r2["start"] == 100.0
    r0 = HopDriver().result(lab, flows[0], 0)
    assert not r0["complete"] and r0["bytes"] == 0


def test_run_all_resume_keeps_finished_runs_and_reruns_the_rest(tmp_path, monkeypatch):
    e = dummy_experiment()
    e.full = Scale(reps=4, points=[None])
    calls = []

    def fake_run_one(e_, v, p, rep, attempt, quick, out, progress, medium=None):
        calls.append((rep, attempt))
        return {"experiment": e_.id, "variant": v.name, "point": p, "rep": rep, "attempt": attempt,
                "status": "valid", "flows": []}

    def prev(rep, attempt, status):
        return {"experiment": e.id, "variant": "a", "point": None, "rep": rep, "attempt": attempt,
                "status": status, "flows": []}

    monkeypatch.setattr(runner, "run_one", fake_run_one)
    monkeypatch.setattr(runner, "unavailable", lambda v: "missing" if v.name == "b" else None)
    previous = [prev(0, 0, "valid"), prev(1, 0, "invalid"), prev(2, 0, "invalid"), prev(2, 1, "invalid"),
                prev(3, 0, "error")]
    recs = runner.run_all([e], False, None, tmp_path, progress=lambda s: None, retry_invalid=1, previous=previous)
    # rep 0 is done; rep 1 gets its one repeat; rep 2 used up its attempts; a failed run is run again
    assert calls == [(1, 1), (3, 0)]
    a = [(r["rep"], r["attempt"], r["status"]) for r in recs if r["variant"] == "a"]
    assert a == [(0, 0, "valid"), (1, 0, "invalid"), (1, 1, "valid"), (2, 0, "invalid"), (2, 1, "invalid"),
                 (3, 0, "valid")]


def test_resume_keeps_finished_runs_of_a_protocol_that_cannot_run_now(tmp_path, monkeypatch):
    e = dummy_experiment()
    e.full = Scale(reps=3, points=[None])
    calls = []

    def fake_run_one(e_, v, p, rep, attempt, quick, out, progress, medium=None):
        calls.append((v.name, rep))
        return {"experiment": e_.id, "variant": v.name, "point": p, "rep": rep, "attempt": attempt,
                "status": "valid", "flows": []}

    def prev(variant, rep, status):
        return {"experiment": e.id, "variant": variant, "point": None, "rep": rep, "attempt": 0,
                "status": status, "flows": []}

    monkeypatch.setattr(runner, "run_one", fake_run_one)
    # "b" ran before (its tool was there) but cannot run where the reproduction is resumed
    monkeypatch.setattr(runner, "unavailable", lambda v: "tool missing" if v.name == "b" else None)
    previous = [prev("a", 0, "valid"), prev("b", 0, "valid"), prev("b", 1, "valid")]
    recs = runner.run_all([e], False, None, tmp_path, progress=lambda s: None, retry_invalid=0, previous=previous)
    assert ("b", 0) not in calls and ("b", 1) not in calls
    b = sorted((r["rep"], r["status"]) for r in recs if r["variant"] == "b")
    # the two finished runs are kept; only the one never run is "not run"
    assert b == [(0, "valid"), (1, "valid"), (2, "not run")]
    assert [r.get("reason") for r in recs if r["variant"] == "b" and r["rep"] == 2] == ["tool missing"]


def test_interrupted_resume_keeps_the_records_it_had_not_reached(tmp_path, monkeypatch):
    e = dummy_experiment()
    e.full = Scale(reps=4, points=[None])

    def prev(rep, status):
        return {"experiment": e.id, "variant": "a", "point": None, "rep": rep, "attempt": 0,
                "status": status, "flows": []}

    def interrupted(e_, v, p, rep, attempt, quick, out, progress, medium=None):
        if rep == 1 and attempt == 0:
            return {"experiment": e_.id, "variant": v.name, "point": p, "rep": rep, "attempt": 0,
                    "status": "error", "flows": []}
        raise KeyboardInterrupt

    monkeypatch.setattr(runner, "run_one", interrupted)
    monkeypatch.setattr(runner, "unavailable", lambda v: "missing" if v.name == "b" else None)
    # rep 1 failed before and is run again; rep 3 never ran: the interruption comes there
    other = {"experiment": "other", "variant": "a", "point": None, "rep": 0, "attempt": 0, "status": "valid",
             "flows": []}  # another experiment of the same directory (--only resumes a part)
    previous = [prev(0, "valid"), prev(1, "error"), prev(2, "valid"), other]
    with pytest.raises(KeyboardInterrupt):
        runner.run_all([e], False, None, tmp_path, progress=lambda s: None, retry_invalid=0, previous=previous)
    written = _json.loads((tmp_path / "runs.json").read_text())
    # rep 2's valid record, not reached when the run stopped, is still there
    assert sorted((r["rep"], r["status"]) for r in written if r["experiment"] == e.id and r["variant"] == "a") == [
        (0, "valid"), (1, "error"), (2, "valid")]
    assert other in written


def test_single_repetition_interval_is_over_flows_paired_for_ratios():
    e = dummy_experiment()

    def run(variant, goodputs):
        return {"experiment": e.id, "variant": variant, "point": None, "rep": 0, "status": "valid",
                "flows": [{"label": f"m{i}", "goodput_mbps": g} for i, g in enumerate(goodputs)]}

    runs = [run("a", [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]), run("b", [0.5, 1.0, 1.5, 2.0, 2.5, 3.0])]
    med = tables.row_result(paper.Row(e.id, "median a", "median", "a", "x"), e, runs, {})
    assert med["ci_over"] == "flows" and med["n_flows"] == 6
    lo, hi = med["ci"]
    assert 1.0 <= lo <= med["ours"] <= hi <= 6.0 and lo < hi
    # every flow of a is twice its pair in b: the paired interval of the ratio is exactly 2
    r = tables.row_result(paper.Row(e.id, "a/b", "median", "a", "x", versus="b"), e, runs, {})
    assert r["ours"] == pytest.approx(2.0) and r["ci"] == (pytest.approx(2.0), pytest.approx(2.0))
    # a per-run statistic has no interval with one run
    j = tables.row_result(paper.Row(e.id, "jain a", "jain", "a", "x"), e, runs, {})
    assert j["ci"] is None and "ci_over" not in j


def test_goodput_by_path_length_shows_where_the_mean_comes_from(tmp_path):
    e = dummy_experiment()
    e.by_path_length = True
    # a: all its goodput in its two 2-hop flows; b: the same mean spread over all lengths
    fa = [flow(f"m{i}", g, hops=h) for i, (g, h) in enumerate([(3.0, 2), (3.0, 2), (0, 4), (0, 4), (0, 6), (0, 6)])]
    fb = [flow(f"m{i}", 1.0, hops=h) for i, h in enumerate([2, 2, 4, 4, 6, 6])]
    voip = flow("voip", 0.064, hops=3, driver="voip")
    runs = [rec("a", 0, fa + [voip]), rec("b", 0, fb), rec("b", 1, fb, status="invalid")]
    t = tables.path_length_table(runs, "m")
    assert len(t) == 1 and t[0]["hops"] == [2, 4, 6]  # the VoIP flow is not measured
    a, b = t[0]["variants"]["a"], t[0]["variants"]["b"]
    assert a["by_hops"][2] == {"flows": 2, "mean_mbps": 3.0} and a["by_hops"][6]["mean_mbps"] == 0
    assert a["total_mbps"] == b["total_mbps"] == 6.0
    assert a["hop_mbps"] == 12.0 and b["hop_mbps"] == 24.0
    assert b["runs"] == 1 and b["source"] == "valid"  # the invalid run is left out
    # a protocol with invalid runs only is shown from them, marked
    t = tables.path_length_table([rec("a", 0, fa), rec("b", 1, fb, status="invalid")])
    assert t[0]["variants"]["b"]["source"] == "invalid"
    rows = [paper.Row("x", "median a", "median", "a", "r", value=1.0)]
    meta = {"preset": "test", "date": "d", "machine": "m", "commit": "c", "command": "cmd", "wall_min": 1.0}
    report.aggregate([rec("a", 0, fa), rec("b", 1, fb, status="invalid")], [e], rows, tmp_path, meta, plots=False)
    md = (tmp_path / "report.md").read_text()
    assert "| a | 1 | 3000.0 (2) | 0.0 (2) | 0.0 (2) | 6.00 | 12.00 |" in md
    assert "| b | 1 invalid, indicative | 1000.0 (2) | 1000.0 (2) | 1000.0 (2) | 6.00 | 24.00 |" in md
    # one path length, or too few flows: no table
    assert tables.path_length_table([rec("a", 0, [flow(f"m{i}", 1.0, hops=3) for i in range(8)])]) == []
    assert tables.path_length_table([rec("a", 0, fa[:4])]) == []


def test_airtime_table_splits_the_nodes_time_and_relates_payload_air_to_delivered_bit_hops(tmp_path):
    def with_air(r: dict, large_us: int) -> dict:
        # two nodes, 10 s each: 12 s idle, 2 s sensing, 4 s sending, 2 s receiving
        r["nodes"] = 2
        r["totals"].update(state_idle_us=12_000_000, state_cca_us=2_000_000, state_tx_us=4_000_000,
                           state_rx_us=2_000_000, air_large_us=large_us, air_small_us=500_000,
                           air_mac_us=300_000, air_retry_us=200_000)
        return r

    def queued(r: dict) -> dict:
        # the MAC held data frames 5 s of the 20 node-seconds
        r["totals"].update(queued_us=6_000_000, queued_data_us=5_000_000)
        return r

    # 10 s runs: 2.5 and 1.25 MB delivered over 2 and 4 hops = 80 Mbit x hops
    fl = [flow("m0", 2.0, hops=2, bytes=2_500_000), flow("m1", 1.0, hops=4, bytes=1_250_000),
          flow("bg", 5.0, hops=1, bytes=6_250_000)]
    runs = [queued(with_air(rec("a", 0, fl), 3_000_000)), queued(with_air(rec("a", 1, fl), 1_000_000)),
            with_air(rec("a", 2, fl, status="invalid"), 20_000_000),
            rec("b", 0, fl)]  # recorded before the medium counted airtime
    t = tables.airtime_table(runs, "m")
    assert set(t) == {"a"} and t["a"]["runs"] == 2
    a = t["a"]
    assert a["busy"] == pytest.approx(0.4) and a["tx"] == pytest.approx(0.2)
    assert a["small"] == pytest.approx(0.025) and a["retry"] == pytest.approx(0.01)
    # 3 s or 1 s of large frames on the air -> 26.7 or 80 Mbit x hops per air-second; the
    # median of two values is the lower one (nearest rank)
    assert a["bit_hops_per_air_s"] == pytest.approx(80 / 3)
    assert a["queued_data"] == pytest.approx(0.25)
    e = dummy_experiment()
    meta = {"preset": "test", "date": "d", "machine": "m", "commit": "c", "command": "cmd", "wall_min": 1.0}
    report.aggregate(runs, [e], [], tmp_path, meta, plots=False)
    md = (tmp_path / "report.md").read_text()
    assert "| a | 2 | 40.0 % | 20.0 % |" in md
    assert "| 1.0 % | 25.0 % | 26.67 |" in md


def test_hop_data_counts_sum_every_hopd_and_the_table_relates_them_to_delivered_packet_hops(tmp_path):
    def status(sent: int, received: int, resent: int, dups: int, transport: str = "hop") -> str:
        t = {"sent_by_type": {"data": sent, "bsyn": 5}, "received_by_type": {"data": received},
             "data_retransmissions": resent,
             "extra": {"data_duplicates": dups, "time_ready_ms": 250, "time_feed_ms": 50,
                       "time_round_ms": 100, "time_silent_ms": 400, "time_idle_ms": 200}}
        return _json.dumps({"node": {"transports": [[transport, t]]}})

    run = tmp_path / "run"
    for i, text in enumerate([status(600, 500, 100, 10), status(400, 300, 100, 0), "not json",
                              status(999, 999, 0, 0, transport="atp")]):
        (run / "raw" / f"hopd-{i}").mkdir(parents=True)
        (run / "raw" / f"hopd-{i}" / "status.json").write_text(text)
    h = tables.hop_data_counts(run)
    assert h == {"sent": 1000, "resent": 200, "received": 800, "duplicates": 10, "nodes": 2,
                 "time_ms": {"ready": 500, "feed": 100, "round": 200, "silent": 800, "held": 0, "idle": 400}}
    assert tables.hop_data_counts(tmp_path / "nothing") is None

    # 100 and 50 full packets delivered over 2 and 4 hops: 400 packet-hops for 1000 sent
    p = tables.HOP_PAYLOAD_BYTES
    fl = [flow("m0", 1.0, hops=2, bytes=100 * p), flow("m1", 1.0, hops=4, bytes=50 * p),
          flow("bg", 1.0, hops=1, bytes=900 * p)]
    runs = [rec("a", 0, fl), rec("a", 1, fl, status="invalid"), rec("b", 0, fl)]
    runs[0]["hop_data"] = runs[1]["hop_data"] = h
    t = tables.hop_data_table(runs, "m")
    assert set(t) == {"a"} and t["a"]["runs"] == 1 and t["a"]["nodes_answering"] == 2
    a = t["a"]
    assert a["sent"] == 1000 and a["reached"] == pytest.approx(0.8) and a["resent"] == pytest.approx(0.2)
    assert a["duplicates"] == pytest.approx(0.01) and a["delivered"] == pytest.approx(0.4)
    meta = {"preset": "test", "date": "d", "machine": "m", "commit": "c", "command": "cmd", "wall_min": 1.0}
    report.aggregate(runs, [dummy_experiment()], [], tmp_path, meta, plots=False)
    md = (tmp_path / "report.md").read_text()
    assert "| a | 1 | 1000 | 80.0 % | 20.0 % | 1.0 % | 0.40 |" in md
    # 1.6 of the 2 node-seconds with something to send: 0.5 ready, 0.1 fed, 0.2 round, 0.8 silent
    ht = tables.hop_time_table(runs)
    assert set(ht) == {"a"} and ht["a"]["runs"] == 1
    assert ht["a"]["busy"] == pytest.approx(0.8) and ht["a"]["silent"] == pytest.approx(0.5)
    assert "| a | 1 | 80.0 % | 31.2 % | 6.2 % | 12.5 % | 50.0 % | 0.0 % |" in md


def test_runs_with_routes_chosen_at_run_time_have_no_hop_weighted_figures(tmp_path):
    # With Babel a flow's path length is not known in advance (hops None): its air-time and
    # packet-hop figures are left out rather than counted as one hop, and the report renders.
    p = tables.HOP_PAYLOAD_BYTES
    fl = [flow("m0", 1.0, hops=None, bytes=100 * p), flow("m1", 1.0, hops=3, bytes=50 * p)]
    r = rec("a", 0, fl)
    r["nodes"] = 1
    r["totals"].update(state_idle_us=5_000_000, state_cca_us=0, state_tx_us=5_000_000, state_rx_us=0,
                       air_large_us=1_000_000, air_small_us=0, air_mac_us=0, air_retry_us=0)
    r["hop_data"] = {"sent": 1000, "resent": 0, "received": 900, "duplicates": 0, "nodes": 2}
    air = tables.airtime_table([r], "m")["a"]
    assert air["tx"] == pytest.approx(0.5) and "bit_hops_per_air_s" not in air
    assert "queued_data" not in air  # recorded before the medium counted queue time
    h = tables.hop_data_table([r], "m")["a"]
    assert h["reached"] == pytest.approx(0.9) and "delivered" not in h
    meta = {"preset": "test", "date": "d", "machine": "m", "commit": "c", "command": "cmd", "wall_min": 1.0}
    report.aggregate([r], [dummy_experiment()], [], tmp_path, meta, plots=False)
    md = (tmp_path / "report.md").read_text()
    assert "| a | 1 | 1000 | 90.0 % | 0.0 % | 0.0 % | — |" in md


def test_top_share_is_the_largest_flows_part_of_the_total():
    # Hop §5.3.1: "the top three TCP flows get around 90% of the total goodput"
    assert stats.top_share([5.0, 3.0, 1.0, 0.5, 0.5], 3) == pytest.approx(0.9)
    assert stats.top_share([1.0, 1.0], 3) == pytest.approx(1.0)
    assert stats.top_share([0.0, 0.0, 0.0], 3) is None and stats.top_share([], 3) is None
    fl = [flow("m0", 6.0), flow("m1", 2.0), flow("m2", 1.0), flow("m3", 1.0)]
    assert stats.stat_fn("top3_share")([rec("a", 0, fl)], "m") == pytest.approx(0.9)


def test_started_resends_and_air_per_byte_hop_statistics():
    fl = [flow("m0", 1.0, hops=2, bytes=1000), flow("m1", 0.0, hops=3, bytes=0),
          flow("m2", 0.5, hops=1, bytes=500), flow("m3", 0.0, hops=4, bytes=0)]
    r = rec("a", 0, fl)
    r["totals"]["air_large_us"] = 5.0
    r["hop_data"] = {"sent": 200, "resent": 50, "received": 150}
    assert stats.stat_fn("started")([r], "m") == pytest.approx(0.5)
    assert stats.stat_fn("resend_share")([r], "m") == pytest.approx(0.25)
    # 5 µs of air over 1000 * 2 + 500 * 1 byte-hops = 2 ns per byte-hop
    assert stats.stat_fn("air_per_byte_hop")([r], "m") == pytest.approx(2.0)
    # A run without hopd's counters (TCP) or without deliveries has no figure.
    t = rec("b", 0, [flow("m0", 0.0, bytes=0)])
    assert stats.stat_fn("resend_share")([t], "m") is None
    assert stats.stat_fn("air_per_byte_hop")([t], "m") is None


def test_started_within_ten_seconds_counts_first_bytes_and_needs_a_driver_that_records_them():
    fl = [flow("m0", 1.0), flow("m1", 1.0), flow("m2", 0.0), flow("m3", 0.5)]
    for f, t in zip(fl, [3.0, 10.0, None, 12.5]):
        f["time_to_first_byte_s"] = t
    assert stats.stat_fn("started_10s")([rec("a", 0, fl)], "m") == pytest.approx(0.5)
    # A driver that keeps no first byte's time gives no figure, not zero.
    assert stats.stat_fn("started_10s")([rec("b", 0, [flow("m0", 1.0)])], "m") is None


def test_random_meshes_run_one_floor_per_repetition_and_are_opt_in():
    from hoplab.experiments import hop_paper as hp
    e = registry()["hop-random"]
    assert e.opt_in and {v.name for v in e.variants if not v.diagnostic} == {"hop", "tcp"}
    assert e.full.points == [12, 30] and e.full.reps == len(hp.RANDOM_MESH_SEEDS) >= 5
    seeds = []
    for rep in range(e.full.reps):
        a = e.spec(e.variant("hop"), 30, rep, quick=False)
        b = e.spec(e.variant("tcp"), 30, rep, quick=False)
        pairs = [[(f["src"], f["dst"], f["start"]) for f in x["flow"]] for x in (a, b)]
        assert a["topology"] == b["topology"] and pairs[0] == pairs[1] and len(a["flow"]) == 30
        seeds.append(a["topology"]["seed"])
        # drawn on that floor, among the pairs its ETX routes take two hops or more
        multi_hop = {(x, y) for x, y, _h in hp.pairs_by_hops(hp.mesh(seeds[-1]), 2, 99)}
        assert all((f["src"], f["dst"]) in multi_hop for f in a["flow"])
    assert seeds == list(hp.RANDOM_MESH_SEEDS)
    assert len(e.spec(e.variant("hop"), 12, 0, quick=False)["flow"]) == 12


def test_report_only_recovers_the_repeat_limit_of_invalid_runs():
    # recorded with each run since the limit was kept in runs.json
    assert runner.retry_limit([{"attempt": 0, "retry_invalid": 1}, {"attempt": 0, "retry_invalid": 1}]) == 1
    assert runner.retry_limit([{"attempt": 0, "retry_invalid": 0}]) == 0
    # older records: at least the highest repeat made
    assert runner.retry_limit([{"attempt": 0}, {"attempt": 2}]) == 2
    assert runner.retry_limit([{"status": "not run", "attempt": 0}]) == 0
    assert runner.retry_limit([]) == 0
    rep = {"meta": {"preset": "full", "date": "d", "machine": "m", "commit": "c", "command": "x",
                    "retry_invalid": runner.retry_limit([{"attempt": 1}])},
           "ci_method": "bootstrap", "experiments": [], "rows": []}
    assert "repeated up to 1 time(s)" in report.markdown(rep)


def test_hxh_experiments_give_tcp_the_papers_packet_size():
    reg = registry()
    dumbbell, grid = reg["hxh-dumbbell"], reg["hxh-grid"]
    flows = lambda e, v: [f for f in e.spec(e.variant(v), None, 0, quick=False)["flow"]]  # noqa: E731
    # HxH §4: 1000-byte packets for every protocol; TCP_MAXSEG 1012 leaves 1000 beside the timestamps
    for e in (dumbbell, grid):
        assert all(f["options"]["mss"] == 1012 for f in flows(e, "tcp-reno"))
    # the kernel's own segments only as the dumbbell's reference
    assert all("mss" not in f.get("options", {}) for f in flows(dumbbell, "tcp-reno-1448"))
    assert "tcp-reno-1448" not in [v.name for v in grid.variants]
    # HxH with the paper's passive feedback: hopd overhears, the medium passes it the frames
    for e in (dumbbell, grid):
        hxh = e.spec(e.variant("hxh"), None, 0, quick=False)
        assert hxh["medium"]["overhear"] and all(f["options"]["overhear"] for f in hxh["flow"])
    explicit = dumbbell.spec(dumbbell.variant("hxh-explicit"), None, 0, quick=False)
    assert not explicit["medium"].get("overhear") and all("overhear" not in f["options"] for f in explicit["flow"])


def test_sensed_dumbbell_senses_every_two_hop_pair_and_nothing_else():
    e = registry()["hxh-dumbbell-sensed"]
    d = e.spec(e.variant("hxh"), None, 0, quick=False)
    t = d["_topology"]
    linked = {tuple(sorted((x["a"], x["b"]))) for x in t["links"]}
    sense = {tuple(p) for p in t["sense"]}
    assert not sense & linked
    # the chain 4-5-6-7-8 and its ends: sources 0-3 sense 5, 7 senses the sinks 9-12
    assert {(4, 6), (5, 7), (6, 8)} <= sense and {(s, 5) for s in range(4)} <= sense
    assert {(7, k) for k in range(9, 13)} <= sense and (4, 7) not in sense
    plain = registry()["hxh-dumbbell"].spec(e.variant("hxh"), None, 0, quick=False)
    assert "sense" not in plain["_topology"]
    assert [f["src"] for f in d["flow"]] == [f["src"] for f in plain["flow"]]


def test_topology_sense_pairs_survive_a_round_trip_through_a_file():
    from hoplab import topology as topo

    t = topo.chain(4)
    t.sense = {(0, 2), (1, 3)}
    back = topo.from_dict(t.to_dict())
    assert back.sense == t.sense and back.links == t.links
    with pytest.raises(LabError):
        topo.from_dict({"nodes": 3, "links": [{"a": 0, "b": 1}], "sense": [[0, 1]]})


def test_hop_rts_sends_only_its_micro_block_frames_after_rts():
    reg = registry()
    e = reg["hop-5.6.1"]
    v = e.variant("hop-rts")
    assert v.diagnostic and v.driver == "hop"
    sp = specmod.from_dict(e.spec(v, "4KB", 0, False))
    # above BSYN/BACK alone (a BACK's bitmap for a 1 MiB block is 95 bytes), below a micro BSYN
    # carrying one packet of the file (84 + 1380 bytes of Hop datagram)
    assert 300 <= sp.medium.rts_threshold_bytes() < 84 + 1380
    assert not sp.medium.rts_cts


def test_the_report_opens_with_the_rows_that_have_a_paper_figure():
    e = dummy_experiment()
    runs = [rec("a", 0, [flow("m", 2.0)]), rec("b", 0, [flow("m", 1.0)])]
    with_paper = tables.row_result(paper.Row("x", "median a / b", "median", "a", "r", versus="b", value=4.0), e, runs, {})
    ours_only = tables.row_result(paper.Row("x", "median b / a (not in the paper)", "median", "b", "r", versus="a"),
                              e, runs, {})
    rep = {"meta": {"preset": "full", "date": "d", "machine": "m", "commit": "c", "command": "x"},
           "ci_method": "bootstrap", "experiments": [{
               "id": "x", "title": "t", "ref": "r", "notes": [], "point_name": "", "variants": {"a": "A", "b": "B"},
               "runs": tables.run_accounting(runs), "invalid": [], "counters": {}, "wall_s": 60.0,
               "rows": [with_paper, ours_only]}]}
    md = report.markdown(rep)
    glance = md[md.index("## The papers' figures at a glance"):md.index("## x: t")]
    assert "| x | median a / b | 2× [no CI] (n=1) | 4× | 0.5 |" in glance
    assert "not in the paper" not in glance
    # the experiment's own table keeps both
    section = md[md.index("## x: t"):]
    assert "| median a / b |" in section and "| median b / a (not in the paper) |" in section


def test_few_retries_changes_only_the_radios_retry_limit_of_hops_runs():
    from hoplab.experiments import hop_paper as hp
    for exp in ("hop-5.2", "hop-5.3", "hop-5.3-good", "hop-random"):
        e = registry()[exp]
        v = e.variant(f"hop-retry{hp.FEW_RETRIES}")
        assert v.diagnostic
        point = e.full.points[0]
        few = e.spec(v, point, 0, quick=False)
        hop = e.spec(e.variant("hop"), point, 0, quick=False)
        tcp = e.spec(e.variant("tcp"), point, 0, quick=False)
        assert few["medium"]["retry_limit"] == hp.FEW_RETRIES < hop["medium"]["retry_limit"]
        assert tcp["medium"]["retry_limit"] == hop["medium"]["retry_limit"]
        assert few["topology"] == hop["topology"] and few["flow"] == hop["flow"]
        assert {k: x for k, x in few["medium"].items() if k != "retry_limit"} == \
            {k: x for k, x in hop["medium"].items() if k != "retry_limit"}
