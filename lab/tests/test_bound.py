"""The conflict-graph bound (hoplab bound) on floors whose best allocations are known by hand."""

import json

import pytest

from hoplab import bound as bd
from hoplab.cli import main
from hoplab.errors import LabError
from hoplab.topology import Topology, chain

C = bd.frame_payload_rate_mbps(11.0)


def test_full_frame_payload_rate_at_11_mbps():
    # 1460 payload bytes in 192 us + 1534 bytes at 11 Mbit/s.
    assert C == pytest.approx(11680 / (192 + 1534 * 8 / 11))
    with pytest.raises(LabError):
        bd.frame_payload_rate_mbps(0)


def test_one_clean_link_carries_the_full_rate():
    b = bd.bound(chain(2), [(0, 1), (0, 1)], 11.0)
    # Two flows share the link: C between them whatever the split.
    assert b.max_mean == pytest.approx(C / 2)
    assert b.max_min == pytest.approx([C / 2, C / 2])
    assert b.mean_at_jain(1.0) == pytest.approx(C / 2, rel=1e-4)


def test_a_lossy_link_delivers_its_delivery_ratio():
    b = bd.bound(chain(2, loss=0.5), [(0, 1)], 11.0)
    assert b.max_mean == pytest.approx(C * 0.5)


def test_hops_of_a_chain_take_turns_within_range():
    # 0-1-2-3: the three links conflict pairwise (shared node, or sender 2 next to receiver 1).
    b = bd.bound(chain(4), [(0, 3)], 11.0)
    assert len(b.cliques) == 1
    assert b.max_mean == pytest.approx(C / 3)


def test_links_out_of_each_others_range_run_at_once():
    b = bd.bound(chain(5), [(0, 1), (3, 4)], 11.0)
    assert b.max_mean == pytest.approx(C)
    assert b.max_min == pytest.approx([C, C])


def test_a_hidden_pair_shares_its_receiver():
    t = Topology(3)
    t.add(0, 1)
    t.add(2, 1)
    assert t.hidden_pairs() == [(0, 2)]
    b = bd.bound(t, [(0, 1), (2, 1)], 11.0)
    assert b.max_mean == pytest.approx(C / 2)


def test_fairness_costs_the_mean_as_worked_by_hand():
    # Flow a: 0 -> 1 (1 hop); flow b: 0 -> 2 (2 hops). One clique: r_a + 2 r_b <= C.
    b = bd.bound(chain(3), [(0, 1), (0, 2)], 11.0)
    assert b.hops == [1, 2]
    assert b.max_mean == pytest.approx(C / 2)  # all to the one-hop flow
    assert b.max_min == pytest.approx([C / 3, C / 3])
    assert bd.jain_hop_weighted(b.max_min, b.hops) == pytest.approx(0.9)
    # Hop-weighted Jain 1: r_a = 2 r_b, so 4 r_b = C, mean 3C/8.
    assert b.mean_at_jain(1.0) == pytest.approx(3 * C / 8, rel=1e-4)
    # Anything at or below 1/n allows every allocation.
    assert b.mean_at_jain(0.5) == pytest.approx(C / 2)
    # A measured allocation: half the best at its own Jain index.
    g = [3 * C / 16, 3 * C / 32]  # Jain 1, mean 9C/64 against 3C/8
    assert b.share_of_frontier(g) == pytest.approx((9 / 64) / (3 / 8), rel=1e-3)
    with pytest.raises(LabError):
        b.mean_at_jain(1.5)


def test_no_route_is_an_error():
    t = Topology(3)
    t.add(0, 1)
    with pytest.raises(LabError, match="no route from 0 to 2"):
        bd.bound(t, [(0, 2)], 11.0)


def test_cli_reads_a_run(tmp_path, capsys):
    res = {
        "name": "two-flows",
        "topology": chain(3).to_dict(),
        "routing": "etx",
        "medium": {"rate_mbps": 11.0},
        "wall_seconds": 120.0,
        "timed_out": False,
        "flows": [
            {"src": 0, "dst": 1, "goodput_mbps": C / 4, "complete": True},
            {"src": 0, "dst": 2, "goodput_mbps": C / 8, "complete": True},
        ],
    }
    f = tmp_path / "results.json"
    f.write_text(json.dumps(res))
    assert main(["bound", str(f), "--jain", "1"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("| draw | flows | best mean, any | best mean, Jain >= 1 |")
    row = out[2]
    assert f"| {1000 * C / 2:.1f} | {1000 * 3 * C / 8:.1f} |" in row
    assert "(1.00, 50 %)" in row


def test_cli_names_what_it_cannot_read(tmp_path, capsys):
    assert main(["bound", str(tmp_path / "missing.json")]) == 2
    assert "cannot read" in capsys.readouterr().err


def test_report_section_names_draws_where_the_targets_conflict(tmp_path):
    from hoplab.reproduce.report import _bound_md
    from hoplab.reproduce.tables import bound_table

    # chain 0-1-2, flows 0 -> 1 and 0 -> 2: best mean C/2, 3C/8 at Jain 1.
    res = {"topology": chain(3).to_dict(), "routing": "etx", "medium": {"rate_mbps": 11.0}}
    (tmp_path / "r0").mkdir()
    (tmp_path / "r0" / "results.json").write_text(json.dumps(res))

    def run(variant, goodputs):
        return {"experiment": "x", "variant": variant, "point": 2, "rep": 0, "status": "valid", "dir": "r0",
                "flows": [{"label": f"m{i}", "src": 0, "dst": i + 1, "goodput_mbps": g}
                          for i, g in enumerate(goodputs)]}

    # TCP gives 0.8 C to the one-hop flow and starves the other: mean 0.4 C.
    runs = [run("hop", [C / 4, C / 8]), run("tcp", [0.8 * C, 0.0]),
            {"experiment": "x", "variant": "hop", "point": 2, "rep": 1, "status": "valid", "dir": "gone",
             "flows": [{"label": "m0", "src": 0, "dst": 1, "goodput_mbps": 1.0},
                       {"label": "m1", "src": 0, "dst": 2, "goodput_mbps": 1.0}]}]
    rows = bound_table(runs, tmp_path, "m", jain=1.0)
    assert [r["rep"] for r in rows] == [0, 1]
    assert rows[0]["best_at_jain"] == pytest.approx(3 * C / 8, rel=1e-3)
    assert rows[0]["variants"]["hop"]["share"] == pytest.approx(0.5, rel=1e-3)
    assert "error" not in rows[0] and "error" in rows[1]
    md = "\n".join(_bound_md(rows, "flows"))
    assert "| flows 2, draw 0 | 2 |" in md
    assert "not bounded:" in md
    assert "Median share of the best mean at the protocol's own Jain index, over draws: hop 50 %; tcp" in md
    # TCP's mean 0.4 C: 1.25 x 0.4 C = 0.5 C > 3C/8.
    assert "below it on 1 of 1 draws (flows 2, draw 0)" in md


def test_paths_given_replace_the_routes():
    # A 0-1-2 triangle: ETX goes straight 0 -> 2; the path given detours through 1.
    t = Topology(3)
    t.add(0, 1)
    t.add(1, 2)
    t.add(0, 2)
    assert bd.bound(t, [(0, 2)], 11.0).max_mean == pytest.approx(C)
    assert bd.bound(t, [(0, 2)], 11.0, paths=[[0, 1, 2]]).max_mean == pytest.approx(C / 2)
    with pytest.raises(LabError, match="path of links"):
        bd.bound(t, [(0, 2)], 11.0, paths=[[0, 2, 1]])


def test_cli_bounds_a_simulator_result_over_its_routes(tmp_path, capsys):
    scenario = tmp_path / "chain.toml"
    scenario.write_text("name = \"chain\"\nduration = 10.0\n[topology]\nnodes = 3\nrate_mbps = 11.0\n"
                        "[[topology.links]]\na = 0\nb = 1\nloss_ab = 0.0\nloss_ba = 0.0\n"
                        "[[topology.links]]\na = 1\nb = 2\nloss_ab = 0.0\nloss_ba = 0.0\n")
    # One-hop and two-hop flow; goodputs C/4 and C/8 over 10 s from start 0: Jain 1, half the best.
    result = {"seed": 7, "virtual_seconds": 10.0, "flows": [
        {"src": 0, "dst": 1, "route": [0, 1], "start": 0.0, "bytes_delivered": int(C / 4 * 1e6 / 8 * 10)},
        {"src": 0, "dst": 2, "route": [0, 1, 2], "start": 0.0, "bytes_delivered": int(C / 8 * 1e6 / 8 * 10)}]}
    f = tmp_path / "r.json"
    f.write_text(json.dumps(result))
    assert main(["bound", "--sim", str(scenario), str(f), "--jain", "1"]) == 0
    row = capsys.readouterr().out.splitlines()[2]
    assert row.startswith(f"| r.json | 2 | {1000 * C / 2:.1f} | {1000 * 3 * C / 8:.1f} |")
    assert "7 " in row and "(1.00, 50 %)" in row
    placed = tmp_path / "placed.toml"
    placed.write_text("name = \"p\"\nduration = 10.0\n[topology]\nnodes = 3\n")
    assert main(["bound", "--sim", str(placed), str(f)]) == 2
    assert "places its nodes" in capsys.readouterr().err
