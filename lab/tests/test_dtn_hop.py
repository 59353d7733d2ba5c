"""dtn7 over Hop (the `dtn-hop` driver): the daemons' command lines, the experiments that
compare it with the `dtn` driver and Hop, the report's bundle table, and bundles moved over
an emulated 2-hop chain by dtnd at the ends, hop-dtn and hopd.

The emulated test needs root, dtnd (scripts/setup-dtn7.sh) and the binaries hopd,
hop and hop-dtn; without them it is skipped, except in CI (CI=true), where it must run."""

import os
from pathlib import Path

import pytest

from hoplab import lab, spec
from hoplab.drivers import DRIVERS, HopDriver, dtn, dtnhop
from hoplab.errors import LabError
from hoplab.experiments import registry
from hoplab.reproduce import report, runner, tables


def have_binaries():
    try:
        dtn.dtnd_binary()
        for b in ("hopd", "hop", "hop-dtn"):
            HopDriver.binary(b)
        return True
    except LabError:
        return False


needs_binaries = pytest.mark.skipif(not have_binaries() and os.environ.get("CI") != "true",
                                    reason="dtnd, hopd or hop-dtn missing "
                                           "(scripts/setup-dtn7.sh; cargo build --release -p hopd)")
needs_root = pytest.mark.skipif(os.geteuid() != 0 and not os.environ.get("CI"),
                                reason="needs root (CI runs as root)")


def test_dtnd_has_the_external_convergence_layer_and_no_tcp_or_static_peers():
    args = dtnhop.dtnd_args(3, Path("/w"), Path("/w/r"))
    assert "--ecla" in args and "--disable_nd" in args
    assert "-C" not in args and "-s" not in args
    # dtnd 0.21's announcer serves the ECLA modules and panics on -i 0
    assert args[args.index("-i") + 1] != "0"
    assert args[args.index("-n") + 1] == "n3" and args[args.index("-j") + 1] == dtn.JANITOR
    assert args[args.index("-r") + 1] == "static" and "static.routes=/w/r" in args
    # the next hop of a destination is the destination: the bridge reaches it over Hop
    assert dtn.routes_text(0, {3: 3}) == "1 ** dtn://n3/** dtn://n3/\n"


def test_bridge_announces_each_other_flow_end_as_its_hop_node():
    ends = dtnhop.flow_ends([spec.Flow(driver="dtn-hop", src=0, dst=2), spec.Flow(driver="dtn-hop", src=5, dst=2)])
    assert ends == {0: {2}, 2: {0, 5}, 5: {2}}
    args = dtnhop.bridge_args(Path("/s"), Path("/h.sock"), sorted(ends[2]))
    peers = [args[i + 1] for i, a in enumerate(args) if a == "--peer"]
    assert peers == [f"dtn://n0/={HopDriver.node_id(0)}", f"dtn://n5/={HopDriver.node_id(5)}"] == \
        ["dtn://n0/=1", "dtn://n5/=6"]
    assert args[args.index("--dtnd") + 1] == "127.0.0.1:3000"
    assert args[args.index("--hopd-socket") + 1] == "/h.sock"


def test_the_medium_reports_link_status_to_the_hopds_of_dtn_hop_runs():
    d = {"topology": {"kind": "chain", "nodes": 3}, "flow": [{"driver": "dtn-hop", "src": 0, "dst": 2, "size": 1000}]}
    assert spec.from_dict(d).reports_link_status()
    d["flow"][0]["driver"] = "dtn"
    assert not spec.from_dict(d).reports_link_status()
    assert DRIVERS["dtn-hop"].done_when == "receiver"
    assert getattr(DRIVERS["dtn-hop"](), "finished", None) is None  # done when its receiver is


def test_the_run_ends_once_each_source_knows_the_outcome_of_its_bundles(tmp_path, monkeypatch):
    """A source learns a bundle arrived after its receiver has it (the last end-to-end BACK):
    collecting waits for the source bridge's outcomes, up to SOURCE_OUTCOME_WAIT_S."""
    import json
    import threading
    import time
    from types import SimpleNamespace

    lab_ = SimpleNamespace(work=tmp_path, spec=spec.from_dict({
        "topology": {"kind": "chain", "nodes": 3},
        "flow": [{"driver": "dtn-hop", "src": 0, "dst": 2, "size": 1000}]}))
    collected = []
    monkeypatch.setattr(dtnhop, "COUNTERS_PERIOD_S", 0.0)
    monkeypatch.setattr(HopDriver, "collect", lambda self, lab: collected.append(time.time()))
    counters = dtnhop.state_dir(lab_, 0) / "counters.json"
    counters.parent.mkdir()
    write = lambda done: counters.write_text(json.dumps({"to_hop": 3, "hop_complete": done, "hop_failed": 0}))
    write(2)
    assert not dtnhop.outcomes_known(dtnhop.state_dir(lab_, 0))
    later = threading.Timer(0.6, write, args=(3,))
    later.start()
    t0 = time.time()
    dtnhop.DtnHopDriver().collect(lab_)
    later.join()
    assert dtnhop.outcomes_known(dtnhop.state_dir(lab_, 0))
    assert 0.6 <= collected[0] - t0 < 5
    # A source that never learns gives up waiting.
    write(2)
    monkeypatch.setattr(dtnhop, "SOURCE_OUTCOME_WAIT_S", 0.5)
    t0 = time.time()
    dtnhop.DtnHopDriver().collect(lab_)
    assert 0.5 <= collected[1] - t0 < 3


def test_experiments_compare_dtn_over_hop_with_dtn_and_hop_and_are_opt_in():
    reg = registry()
    for eid, hop_name in (("dtn-hop-5.2", "hop"), ("dtn-hop-5.7", "hop-h100"), ("dtn-hop-lossy", "hop")):
        e = reg[eid]
        assert e.opt_in
        assert {v.name for v in e.variants} == {hop_name, "dtn", "dtn-hop"}
        specs = {v.name: e.spec(v, e.full.points[0], 0, False) for v in e.variants}
        assert len({(s["flow"][0]["src"], s["flow"][0]["dst"], s["flow"][0]["size"]) for s in specs.values()}) == 1
        # both DTN variants send the same bundles; dtn-hop's hopd is set up as Hop's
        assert specs["dtn"]["flow"][0]["options"]["bundle"] == specs["dtn-hop"]["flow"][0]["options"]["bundle"]
        hop_opts = {k: v for k, v in specs["dtn-hop"]["flow"][0]["options"].items() if k not in ("bundle", "janitor")}
        assert hop_opts == specs[hop_name]["flow"][0]["options"]
        assert specs["dtn-hop"]["medium"] == specs[hop_name]["medium"]
    # the §5.2 setting draws hop-5.2's pairs; §5.7 with H = 100 and the retrying janitor
    e52, h52 = reg["dtn-hop-5.2"], reg["hop-5.2"]
    assert e52.full.points == h52.full.points
    for p in e52.full.points:
        assert (e52.spec(e52.variant("dtn-hop"), p, 0, False)["flow"][0]["src"]
                == h52.spec(h52.variant("hop"), p, 0, False)["flow"][0]["src"])
    f57 = reg["dtn-hop-5.7"].spec(reg["dtn-hop-5.7"].variant("dtn-hop"), None, 0, False)
    assert f57["flow"][0]["options"]["hop"] == {"backpressure_limit": 100}
    assert f57["flow"][0]["options"]["janitor"] == "10s" and f57["duration"] == 180.0
    minutes = sum(reg[x].estimate(False)[1] for x in ("dtn-hop-5.2", "dtn-hop-5.7", "dtn-hop-lossy")) / 60
    assert minutes < 25
    if have_binaries():
        assert runner.unavailable(reg["dtn-hop-5.2"].variant("dtn-hop")) is None


def test_bundle_table_sums_deliveries_duplicates_and_bridge_counters(tmp_path):
    counters = {k: 0 for k in tables.BRIDGE_COUNTERS}
    src = dict(counters, from_dtnd=3, to_hop=3, hop_complete=3)
    dst = dict(counters, to_dtnd=3, duplicates_from_hop=1)

    def run(variant, rep, flow):
        return {"experiment": "x", "variant": variant, "point": 2, "rep": rep, "status": "valid",
                "flows": [dict({"label": "m", "goodput_mbps": 1.0, "hops": 2}, **flow)]}

    runs = [run("dtn-hop", 0, {"bundles": 3, "dup_bundles": 0, "bad_bundles": 0, "bridge": {"0": src, "2": dst}}),
            run("dtn-hop", 1, {"bundles": 2, "dup_bundles": 1, "bad_bundles": 0, "bridge": {"0": src, "2": dst}}),
            run("dtn", 0, {"bundles": 3, "dup_bundles": 2, "bad_bundles": 0}),
            run("hop", 0, {})]
    t = tables.bundle_table(runs, "m")
    assert set(t) == {"dtn", "dtn-hop"}
    assert t["dtn-hop"]["bundles"] == 5 and t["dtn-hop"]["dup_bundles"] == 1 and t["dtn-hop"]["runs"] == 2
    assert t["dtn-hop"]["bridge"]["hop_complete"] == 6 and t["dtn-hop"]["bridge"]["duplicates_from_hop"] == 2
    assert "bridge" not in t["dtn"] and t["dtn"]["dup_bundles"] == 2
    md = "\n".join(report._bundles_md(t))
    assert "| dtn-hop | 2 | 5 | 1 | 0 | 6 | 6 | 0 | 0 | 0 | 0 | 6 | 2 |" in md
    assert "| dtn | 1 | 3 | 2 | 0 | — |" in md



@needs_root
@needs_binaries
@pytest.mark.usefixtures("medium_server")
def test_emulated_dtn_over_hop_two_hop_chain(tmp_path, run_waiting):
    """Three bundles from node 0 to node 2 through dtnd, hop-dtn and hopd at the ends and
    hopd alone at the relay: each arrives once."""
    size, bundle = 150_000, 50_012  # three bundles of 50 000 payload bytes
    sp = spec.from_dict({
        "name": "pytest-dtn-hop", "duration": 40,
        "topology": {"kind": "chain", "nodes": 3},
        "flow": [{"driver": "dtn-hop", "src": 0, "dst": 2, "size": size, "label": "d",
                  "options": {"bundle": bundle, "link_mode": "broadcast"}}],
    })
    res = run_waiting(sp, tmp_path / "out")
    f = res["flows"][0]
    raw = tmp_path / "out" / "raw"
    logs = "\n".join(dtnhop.tail(raw / n) for n in ("hop-dtn-0.log", "hop-dtn-2.log", "dtnd-0.log", "dtnd-2.log"))
    assert f["hops"] == 2
    assert f["complete"] and f["bytes"] == size, logs
    assert f["bundles"] == 3 and f["dup_bundles"] == 0 and f["bad_bundles"] == 0, logs
    src, dst = f["bridge"]["0"], f["bridge"]["2"]
    assert src["from_dtnd"] == src["to_hop"] == src["hop_complete"] == 3, (src, logs)
    assert src["hop_failed"] == 0 and src["duplicates_from_dtnd"] == 0
    assert dst["to_dtnd"] == 3 and dst["duplicates_from_hop"] == 0, (dst, logs)
    assert f["goodput_mbps"] > 0
    # dtnd ran at the flow's ends only: the relay has hopd alone
    assert (raw / "dtnd-0.log").exists() and (raw / "dtnd-2.log").exists() and not (raw / "dtnd-1.log").exists()
    assert (raw / "hopd-1.log").exists()
    assert lab.lab_namespaces() == [] and lab.lab_links() == []
