import math
import random
import statistics

import pytest

from hoplab import routes, topology as T, workloads
from hoplab.errors import SpecError


def test_chain_and_grid_shapes():
    c = T.chain(6)
    assert len(c.undirected()) == 5 and c.neighbours(0) == [1] and c.neighbours(3) == [2, 4]
    g = T.grid(3, 4)
    assert g.n == 12 and len(g.undirected()) == 3 * 3 + 2 * 4
    assert not g.in_range(0, 5)  # diagonal neighbours are out of range
    with pytest.raises(SpecError):
        T.chain(1)


def test_star_has_requested_hidden_pairs():
    s = T.star(7, 6)
    senders = range(1, 8)
    assert all(s.in_range(x, 0) and s.in_range(0, x) for x in senders)
    hidden = [(a, b) for a in senders for b in senders if a < b and not s.in_range(a, b)]
    assert len(hidden) == 6
    assert all(s.in_range(a, b) for a in senders for b in senders if a != b) is False
    full = T.star(7, 0)
    assert all(full.in_range(a, b) for a in senders for b in senders if a != b)


@pytest.mark.parametrize("seed", range(1, 9))
def test_mesh_resembles_testbed(seed):
    m = T.mesh(seed=seed)
    assert m.n == 20 and len(m.undirected()) == 56
    assert T.is_connected(m)
    losses = list(m.links.values())
    assert all(0.0 <= x <= 0.95 for x in losses)
    assert statistics.median(losses) < 0.05  # most links good
    assert 0.15 < statistics.mean(losses) < 0.35  # heavy tail of bad links
    assert T.mesh(seed=seed).links == m.links  # seeded: reproducible


def test_etx_prefers_two_good_hops_over_one_bad():
    t = T.Topology(3)
    t.add(0, 2, 0.7)  # ETX 1/0.09 = 11.1
    t.add(0, 1, 0.0)
    t.add(1, 2, 0.1)  # ETX 1 + 1/0.81 = 2.23
    assert routes.path(t, 0, 2, "etx") == [0, 1, 2]
    assert routes.path(t, 0, 2, "hops") == [0, 2]
    assert math.isclose(routes.etx(t, 1, 2), 1 / 0.81)


def test_unreachable_and_full_loss():
    t = T.Topology(3)
    t.add(0, 1, 1.0)
    assert routes.path(t, 0, 1) is None and routes.path(t, 0, 2) is None
    assert routes.next_hops(t)[0] == {}


@pytest.mark.parametrize("metric", ["etx", "hops"])
def test_routes_loop_free_and_consistent_on_random_meshes(metric):
    for seed in range(1, 6):
        m = T.mesh(seed=seed)
        table = routes.next_hops(m, metric)
        for a in range(m.n):
            for d in range(m.n):
                if a == d:
                    continue
                h = routes.hop_count(table, a, d)
                assert h is not None
                # every installed next hop is an actual neighbour
                assert m.in_range(a, table[a][d])
                if metric == "hops":
                    assert h == len(routes.path(m, a, d, "hops")) - 1


def test_web_size_mix_matches_paper():
    rng = random.Random(7)
    sizes = [workloads.web_size(rng) for _ in range(20000)]
    small = sum(1 for s in sizes if s < 10_000) / len(sizes)
    mid = sum(1 for s in sizes if 10_000 <= s < 100_000) / len(sizes)
    assert abs(small - 0.63) < 0.02 and abs(mid - 0.25) < 0.02


def test_sense_range_adds_sensing_pairs_without_links_or_routes():
    from hoplab import spec

    plain = T.mesh(20, 56, 2)
    t = T.with_sense_range(T.mesh(20, 56, 2), 1.5)
    assert t.links == plain.links  # no new links, so no new routes
    pos = t.positions
    longest = max(math.dist(pos[a], pos[b]) for a, b in t.undirected())
    for a, b in t.sense:
        assert a < b and not t.in_range(a, b) and math.dist(pos[a], pos[b]) <= 1.5 * longest
    # every pair that shares a neighbour is either sensed or farther than the range
    assert len(t.hidden_pairs()) < len(plain.hidden_pairs())
    for a, c in t.hidden_pairs():
        assert math.dist(pos[a], pos[c]) > 1.5 * longest
    # with a range of twice the longest link, no two nodes with a common neighbour are hidden
    assert T.with_sense_range(T.mesh(20, 56, 2), 2.0).hidden_pairs() == []
    assert routes.next_hops(t, "etx") == routes.next_hops(plain, "etx")
    assert t.to_dict()["sense"] and "sense" not in plain.to_dict()
    with pytest.raises(SpecError):
        T.with_sense_range(T.chain(3), 1.5)  # no positions
    with pytest.raises(SpecError):
        T.with_sense_range(T.mesh(20, 56, 2), 0.5)
    # explicit pairs in a spec
    s = spec.from_dict({"topology": {"kind": "chain", "nodes": 3, "sense": [[2, 0]]},
                        "flow": [{"driver": "udp", "src": 0, "dst": 1}]})
    assert s.topology.sense == {(0, 2)} and s.topology.hidden_pairs() == []
    for bad in ([[0, 1]], [[0, 0]], [[0, 9]], [[0]], ["ab"]):
        with pytest.raises(SpecError):
            spec.from_dict({"topology": {"kind": "chain", "nodes": 3, "sense": bad},
                            "flow": [{"driver": "udp", "src": 0, "dst": 1}]})


def test_to_dict_round_trip_keeps_each_direction():
    # The mesh's links lose different shares of frames in each direction.
    t = T.mesh(seed=1)
    assert any(abs(t.links[(a, b)] - t.links[(b, a)]) > 0.05 for a, b in t.links)
    back = T.from_dict(t.to_dict())
    assert back.links == t.links and back.n == t.n and back.name == t.name
    # One entry per link still means both directions, with loss_back for the other one.
    u = T.from_dict({"nodes": 3, "links": [{"a": 0, "b": 1, "loss": 0.2},
                                    {"a": 1, "b": 2, "loss": 0.1, "loss_back": 0.3}]})
    assert u.links == {(0, 1): 0.2, (1, 0): 0.2, (1, 2): 0.1, (2, 1): 0.3}
