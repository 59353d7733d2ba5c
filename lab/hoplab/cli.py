"""Command line: hoplab run | snapshot | clean | demo | selftest | reproduce | compare | results-page."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from . import lab, results, spec as specmod
from .errors import LabError
from .run import run_spec


def default_out(name: str) -> Path:
    return Path("results") / "lab" / f"{time.strftime('%Y%m%d-%H%M%S')}-{name}"


def cmd_run(a) -> int:
    sp = specmod.load(Path(a.spec))
    if a.duration:
        sp.duration = a.duration
    res = run_spec(sp, Path(a.out) if a.out else default_out(sp.name))
    print()
    print(results.markdown(res))
    return 0 if res["valid"] else 3


DEMO_SPEC = {
    "name": "demo-5hop-chain",
    "duration": 400.0,
    "topology": {"kind": "chain", "nodes": 6, "link": [{"a": 2, "b": 3, "loss": 0.2}]},
    "flow": [
        {"driver": "tcp", "src": 0, "dst": 5, "size": "10MB", "label": "tcp-cubic-10MB"},
        # UDP has no reliability: it measures the achievable rate of the path (the bound),
        # sent for as long as the TCP transfer took at most, capped to keep the demo short.
        {"driver": "udp", "src": 0, "dst": 5, "duration": 20.0, "label": "udp-bound",
         "after": "tcp-cubic-10MB", "start": 1.0},
    ],
}


def cmd_demo(a) -> int:
    d = json.loads(json.dumps(DEMO_SPEC))
    if a.size:
        d["flow"][0]["size"] = a.size
    from .drivers import HopDriver
    from .errors import LabError as _LabError

    with_hop = a.with_hop
    if not with_hop and not a.no_hop:
        try:
            HopDriver.binary("hopd")
            HopDriver.binary("hop")
            with_hop = True
        except _LabError:
            print("hoplab demo: hopd not built; showing TCP and the UDP bound only")
    if with_hop:
        d["flow"].append({"driver": "hop", "src": 0, "dst": 5, "size": d["flow"][0]["size"],
                          "label": "hop-10MB", "after": "udp-bound", "start": 1.0})
    sp = specmod.from_dict(d)
    res = run_spec(sp, Path(a.out) if a.out else default_out("demo"))
    print()
    print("| protocol | bytes received | goodput (Mbit/s) | completion (s) |")
    print("|---|---|---|---|")
    for f in res["flows"]:
        if f["driver"] == "udp":
            comp = "n/a (unreliable; rate bound)"
        else:
            comp = f"{f['completion_s']:.1f}" if f["completion_s"] else "incomplete"
        print(f"| {f['label']} | {f['bytes']} | {f['goodput_mbps']:.2f} | {comp} |")
    print(f"\nlag: max {res['lag']['max_ms']} ms ({'valid' if res['valid'] else 'INVALID: ' + res['invalid_reason']}); "
          f"plots: goodput_cdf.png, goodput_box.png in the results directory")
    return 0 if res["valid"] else 3


def cmd_clean(_a) -> int:
    lab.clean(verbose=True)
    return 0


def cmd_selftest(a) -> int:
    from .selftest import selftest

    return selftest(quick=a.quick, out=Path(a.out) if a.out else default_out("selftest"))


def cmd_reproduce(a) -> int:
    from .reproduce.cli import main as reproduce_main

    if a.report_only and not a.out:
        raise LabError("--report-only needs --out DIR (a directory with runs.json)")
    return reproduce_main(a)


def cmd_snapshot(a) -> int:
    import json

    from .reproduce.runner import snapshot

    try:
        res = json.loads(Path(a.results).read_text())
    except (OSError, ValueError) as e:
        raise LabError(f"cannot read {a.results}: {e}") from e
    end = (res.get("progress") or {}).get("rows", [[0.0]])[-1][0]
    for at in a.at or [end]:
        s = snapshot(res, at)
        st = s["stats"]
        print(f"{res.get('name', a.results)} at {s['at']:.1f} s: {s['bytes'] / 1e6:.2f} MB over "
              f"{len(s['flows'])} flows, {s['empty']} with nothing; goodput (Mbit/s) median {st['median']:.4f} "
              f"mean {st['mean']:.4f} total {st['total']:.3f}; hop-weighted Jain {st['jain_hw']:.2f}")
        if a.flows:
            for f in s["flows"]:
                print(f"  {f['label']:<8} {f.get('src', '?')}->{f.get('dst', '?')} hops {f.get('hops', '?')}  "
                      f"{f['bytes'] / 1e6:8.3f} MB  {f['goodput_mbps']:.4f} Mbit/s")
    return 0


def cmd_compare(a) -> int:
    from .compare import main as compare_main

    return compare_main(a)


def cmd_results_page(a) -> int:
    from .compare import load_report
    from .reproduce.report import GENERATED, headline_table, results_page

    src = Path(a.report)
    rep = load_report(src)
    page = results_page(rep, str(src / "report.json" if src.is_dir() else src))
    if not a.out:
        sys.stdout.write(page)
        return 0
    out = Path(a.out)
    if out.exists():
        # A page someone wrote by hand is theirs: only a generated one is replaced.
        first = out.read_text(errors="replace").split("\n", 1)[0]
        if not first.startswith(GENERATED):
            raise LabError(f"{out} exists and does not start with '{GENERATED}' (not a generated page): "
                           "left as it is")
    out.write_text(page)
    rows = max(len(headline_table(rep)) - 2, 0)
    print(f"hoplab results-page: {rows} rows with a paper figure -> {out}")
    return 0


def cmd_bound(a) -> int:
    from .reproduce.bound_runs import bound_table_for, sim_bound_table
    if a.sim:
        lines = sim_bound_table(a.sim, a.runs, a.jain)
    elif len(a.runs) == 1:
        lines = bound_table_for(a.runs[0], a.jain)
    else:
        raise LabError("one run or reproduction directory at a time (several results only with --sim)")
    for line in lines:
        print(line)
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="hoplab", description="Emulated 802.11 mesh experiments")
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="run an experiment spec (TOML)")
    r.add_argument("spec")
    r.add_argument("--out")
    r.add_argument("--duration", type=float, help="override the spec's duration (s)")
    r.set_defaults(fn=cmd_run)
    sn = sub.add_parser("snapshot", help="a run's flows and statistics at given times (from its results.json)")
    sn.add_argument("results", help="results.json of a run")
    sn.add_argument("--at", type=float, action="append", help="seconds into the run (repeatable; default: the end)")
    sn.add_argument("--flows", action="store_true", help="also list every flow")
    sn.set_defaults(fn=cmd_snapshot)

    c = sub.add_parser("clean", help="remove every namespace/tap/process left by the lab")
    c.set_defaults(fn=cmd_clean)
    d = sub.add_parser("demo", help="5-hop 802.11b chain with a lossy link: TCP vs UDP bound")
    d.add_argument("--out")
    d.add_argument("--size", help="transfer size (default 10MB)")
    d.add_argument("--with-hop", action="store_true", help="require the Hop driver (hopd)")
    d.add_argument("--no-hop", action="store_true", help="leave Hop out even if hopd is built")
    d.set_defaults(fn=cmd_demo)
    s = sub.add_parser("selftest", help="validate the emulator against known numbers")
    s.add_argument("--quick", action="store_true")
    s.add_argument("--out")
    s.set_defaults(fn=cmd_selftest)
    rp = sub.add_parser("reproduce", help="re-measure the papers' evaluations and write a report")
    rp.add_argument("--quick", action="store_true", help="small smoke subset (minutes)")
    rp.add_argument("--only", help="comma-separated experiment ids (see --list)")
    rp.add_argument("--reps", type=int, help="repetitions per point (default: the preset's)")
    rp.add_argument("--points", help="comma-separated points to run, e.g. 2,3 (hop counts) or 16KB")
    rp.add_argument("--variants", help="comma-separated variants (protocols) to run, e.g. hop,tcp,hop-nopipe "
                    "(default: the papers' protocols)")
    rp.add_argument("--diagnostics", action="store_true",
                    help="also run our diagnostic variants (mechanisms switched off, other settings) beside them")
    rp.add_argument("--out", help="output directory (default results/reproduce/<time>-<preset>)")
    rp.add_argument("--medium", action="append", metavar="KEY=VALUE",
                    help="override a medium setting in every run, e.g. link_status=true (repeatable)")
    rp.add_argument("--retry-invalid", type=int,
                    help="repeat a run the lab marks invalid (lag) up to N times (default: 1 full, 0 quick)")
    rp.add_argument("--list", action="store_true", help="list the experiments and the time estimate; run nothing")
    rp.add_argument("--resume", action="store_true",
                    help="continue an interrupted reproduction in --out: keep its finished runs, run the rest")
    rp.add_argument("--report-only", action="store_true",
                    help="rebuild report.md/report.json from the runs already in --out")
    rp.set_defaults(fn=cmd_reproduce)

    cp = sub.add_parser("compare", help="two reproduction reports row by row (Markdown table)")
    cp.add_argument("old", help="report.json of the earlier reproduction (or its directory)")
    cp.add_argument("new", help="report.json of the later reproduction (or its directory)")
    cp.add_argument("--apart", action="store_true",
                    help="only the rows whose 95 %% intervals do not overlap")
    cp.set_defaults(fn=cmd_compare)
    bd = sub.add_parser(
        "bound", help="the best mean goodput any protocol could reach on a run's floor and flows",
        description="An upper bound from the conflict graph of the links the flows' routes use (links "
        "sharing a node, or one's sender in range of the other's receiver, take turns; a link delivers "
        "at most the PHY's full-frame payload rate times its delivery ratio): per draw, the best mean "
        "goodput over flows with any allocation, with the hop-weighted Jain index at least --jain, and "
        "max-min fair; and each protocol's mean, its Jain index and its share of the best mean at that "
        "index. kbit/s. docs/lab.md, \"The conflict-graph bound\".")
    bd.add_argument("runs", metavar="RUN", nargs="+",
                    help="a run's results.json (or its directory), or a reproduction's output directory (every "
                    "valid draw of two flows or more in its runs.json); with --sim, hop-sim results (--out)")
    bd.add_argument("--sim", metavar="SCENARIO",
                    help="bound a hop-sim scenario that lists its links, over the routes in the results given")
    bd.add_argument("--jain", type=float, default=0.78,
                    help="hop-weighted Jain index the second column requires (default 0.78, Hop §5.3.2)")
    bd.set_defaults(fn=cmd_bound)
    pg = sub.add_parser(
        "results-page", help="a report's opening table (the rows with a paper figure) as a Markdown page",
        description="Write the opening table of a reproduction report (every row the papers give a figure "
        "for: experiment, figure, ours with its 95 % interval and run count, paper, ours/paper; the same "
        "rows and cells as report.md's first table) as a Markdown page whose first line names the report "
        "it was generated from.")
    pg.add_argument("report", metavar="REPORT_JSON", help="report.json of a reproduction (or its directory)")
    pg.add_argument("--out", metavar="FILE",
                    help="write the page to FILE (default: standard output); an existing FILE is replaced "
                    "only if its first line starts with 'Generated from' (a page written by this command)")
    pg.set_defaults(fn=cmd_results_page)
    a = p.parse_args(argv)
    try:
        return a.fn(a)
    except LabError as e:
        print(f"hoplab: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("hoplab: interrupted; network torn down", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
