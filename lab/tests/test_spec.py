from pathlib import Path

import pytest

from hoplab import schema, spec
from hoplab.errors import SpecError


def base(**over):
    d = {"name": "t", "topology": {"kind": "chain", "nodes": 3},
         "flow": [{"driver": "tcp", "src": 0, "dst": 2, "size": "1MB", "label": "a"}]}
    d.update(over)
    return d


def test_sizes_and_rates():
    assert schema.parse_size("10MB") == 10_000_000
    assert schema.parse_size("64KiB") == 65536
    assert schema.parse_size(1500) == 1500
    assert schema.parse_size("1.5k") == 1500
    assert schema.parse_rate("8kbit") == 8000
    assert schema.parse_rate("2Mbit") == 2e6
    for bad in ("ten", "-3", "5 parsecs"):
        with pytest.raises(SpecError):
            schema.parse_size(bad)


def test_defaults_and_modes():
    s = spec.from_dict(base())
    assert s.medium.standard == "b" and s.medium.rate_mbps == 11.0
    assert s.medium.modes() == ("DsssRate11Mbps", "DsssRate1Mbps", None)
    assert s.flows[0].size == 1_000_000 and s.flows[0].cc == "cubic"
    g = spec.from_dict(base(medium={"standard": "g", "rate_mbps": 54, "broadcast_rate_mbps": 24}))
    assert g.medium.modes() == ("ErpOfdmRate54Mbps", "ErpOfdmRate6Mbps", "ErpOfdmRate24Mbps")


@pytest.mark.parametrize("bad", [
    {"medium": {"standard": "n"}},
    {"medium": {"rate_mbps": 54}},  # not an 802.11b rate
    {"medium": {"txop_us": {"xx": 100}}},
    {"medium": {"retry_limit": -1}},
    {"medium": {"no_arq_acs": ["data"]}},
    {"medium": {"no_arq_acs": "bk"}},
    {"medium": {"no_arq_acs": ["bk"], "auto_rate": True}},
    {"medium": {"no_arq_acs": ["bk"], "classify_dscp": False}},
    {"flow": [{"driver": "tcp", "src": 0, "dst": 0}]},
    {"flow": [{"driver": "nope", "src": 0, "dst": 1}]},
    {"flow": [{"driver": "tcp", "src": 0, "dst": 9}]},
    {"flow": [{"driver": "tcp", "src": 0, "dst": 1, "cc": "vegas"}]},
    {"flow": [{"driver": "tcp", "src": 0, "dst": 1, "after": "ghost"}]},
    {"flow": [{"driver": "tcp", "src": 0, "dst": 1, "background": "yes"}]},
    {"flow": [{"driver": "tcp", "src": 0, "dst": 1, "background": True}]},  # nothing to wait for
    {"flow": [{"driver": "tcp", "src": 0, "dst": 1, "options": {"mss": 40}}]},
    {"flow": [{"driver": "tcp", "src": 0, "dst": 1, "options": {"mss": 9000}}]},
    {"flow": [{"driver": "tcp", "src": 0, "dst": 1, "options": {"mss": "1000"}}]},
    {"flow": [{"driver": "udp", "src": 0, "dst": 1, "options": {"mss": 1000}}]},
    {"flow": [{"driver": "tcp", "src": 0, "dst": 1, "options": "mss=1000"}]},
    {"flow": []},
    {"schedule": [{"at": 1, "action": "explode", "node": 1}]},
    {"schedule": [{"at": 1, "action": "down", "node": 7}]},
    {"schedule": [{"at": 1, "action": "loss", "a": 0, "b": 2, "loss": 0.5}]},  # not a link
    {"unknown_key": 1},
    {"topology": {"kind": "moebius"}},
])
def test_rejects_bad_specs(bad):
    with pytest.raises(SpecError):
        spec.from_dict(base(**bad))


def test_background_flows():
    s = spec.from_dict(base(flow=[{"driver": "tcp", "src": 0, "dst": 2, "size": "1MB", "background": True},
                                  {"driver": "tcp", "src": 1, "dst": 2, "size": "4KB"}]))
    assert [f.background for f in s.flows] == [True, False]


def test_tcp_segment_size_option():
    s = spec.from_dict(base(flow=[{"driver": "tcp", "src": 0, "dst": 2, "size": "1MB", "options": {"mss": 1012}}]))
    assert s.flows[0].options["mss"] == 1012


def test_no_arq_acs_as_tid_mask():
    assert spec.from_dict(base()).medium.no_retry_tids() == 0
    m = spec.from_dict(base(medium={"no_arq_acs": ["bk", "bk"]})).medium
    assert m.no_arq_acs == ["bk"] and m.no_retry_tids() == 0b110  # TIDs 1 and 2
    assert spec.from_dict(base(medium={"no_arq_acs": ["be", "vo"]})).medium.no_retry_tids() == 0b11001001


def test_schedule_sorted_and_link_override():
    s = spec.from_dict(base(
        topology={"kind": "chain", "nodes": 3, "link": [{"a": 1, "b": 2, "loss": 0.3, "loss_back": 0.1}]},
        schedule=[{"at": 5, "action": "up", "node": 1}, {"at": 2, "action": "down", "node": 1},
                  {"at": 3, "action": "loss", "a": 0, "b": 1, "loss": 0.5}]))
    assert [e.at for e in s.schedule] == [2.0, 3.0, 5.0]
    assert s.topology.links[(1, 2)] == 0.3 and s.topology.links[(2, 1)] == 0.1


def test_load_file_topology(tmp_path: Path):
    (tmp_path / "topo.json").write_text('{"nodes": 3, "links": [{"a": 0, "b": 1}, {"a": 1, "b": 2, "loss": 0.2}]}')
    (tmp_path / "x.toml").write_text(
        'name = "f"\n[topology]\nkind = "file"\nfile = "topo.json"\n'
        '[[flow]]\ndriver = "udp"\nsrc = 0\ndst = 2\nrate = "1Mbit"\nduration = 2\n')
    s = spec.load(tmp_path / "x.toml")
    assert s.topology.n == 3 and s.topology.links[(2, 1)] == 0.2
    assert s.flows[0].rate_bps == 1e6


def test_web_workload_expands():
    s = spec.from_dict(base(topology={"kind": "chain", "nodes": 5}, flow=[],
                            workload=[{"kind": "web", "count": 50, "seed": 3}]))
    assert len(s.flows) == 50
    starts = [f.start for f in s.flows]
    assert starts == sorted(starts) and starts[0] > 0
    from hoplab import routes
    table = routes.next_hops(s.topology, "etx")
    assert all(routes.hop_count(table, f.src, f.dst) >= 2 for f in s.flows)


def test_example_specs_parse():
    examples = sorted((Path(__file__).parent.parent / "examples").glob("*.toml"))
    assert len(examples) >= 5
    for p in examples:
        s = spec.load(p)
        assert s.flows and s.topology.n >= 2


def test_link_status_is_on_by_default_and_only_for_runs_with_hopd():
    def mk(driver, **medium):
        return spec.from_dict({"topology": {"kind": "chain", "nodes": 2}, "medium": medium,
                               "flow": [{"driver": driver, "src": 0, "dst": 1, "size": "1KB"}]})
    assert mk("hop").medium.link_status and mk("hop").reports_link_status()
    assert not mk("tcp").reports_link_status()  # nobody would read the reports
    assert not mk("hop", link_status=False).reports_link_status()


def test_rts_threshold_reaches_the_medium_as_ns3s_threshold():
    def m(**medium):
        return spec.from_dict(base(medium=medium)).medium
    assert m().rts_threshold_bytes() == spec.RTS_OFF
    assert m(rts_cts=True).rts_threshold_bytes() == 0
    assert m(rts_threshold=500).rts_threshold_bytes() == 500
    with pytest.raises(SpecError, match="not both"):
        m(rts_cts=True, rts_threshold=500)
    for bad in (-1, spec.RTS_OFF):
        with pytest.raises(SpecError, match="rts_threshold"):
            m(rts_threshold=bad)
