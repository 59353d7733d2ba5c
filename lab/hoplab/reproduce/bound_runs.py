"""`hoplab bound` on runs on disk: a run's results.json, or every draw of a reproduction's
output directory with the goodputs its report uses (hoplab.bound has the bound itself)."""

from __future__ import annotations

import json
from pathlib import Path

from ..bound import bound, draw_bound, markdown, summary
from ..errors import LabError
from .runner import cut_off_goodput


def _draws(path, measure: str = "m") -> list[tuple[str, list[tuple[str, list[dict]]], dict]]:
    """(label, [(variant, flows)], results of one run) for a run's results.json or for every
    draw of a reproduction directory (its runs.json: the goodputs the report uses; the flows
    whose label starts with `measure` when any does, as the report measures them)."""

    def pick(flows: list[dict]) -> list[dict]:
        m = [f for f in flows if str(f.get("label", "")).startswith(measure)]
        return m or flows

    p = Path(path)
    if p.is_dir() and (p / "runs.json").exists():
        groups: dict[tuple, list] = {}
        for r in json.loads((p / "runs.json").read_text()):
            if r.get("status") != "valid" or len(pick(r.get("flows") or [])) < 2:
                continue
            groups.setdefault((r["experiment"], str(r.get("point")), r["rep"]), []).append(r)
        out = []
        for (exp, point, rep), rs in sorted(groups.items()):
            try:
                res = json.loads((p / rs[0]["dir"] / "results.json").read_text())
            except (OSError, ValueError) as e:
                raise LabError(f"cannot read the results of {exp} {point} draw {rep}: {e}") from e
            out.append((f"{exp} {point} draw {rep}", [(r["variant"], pick(r["flows"])) for r in rs], res))
        if not out:
            raise LabError(f"{p}/runs.json has no valid run with two flows or more")
        return out
    f = p / "results.json" if p.is_dir() else p
    try:
        res = json.loads(f.read_text())
    except (OSError, ValueError) as e:
        raise LabError(f"cannot read {f}: {e}") from e
    flows = pick(cut_off_goodput(res.get("flows") or [], res.get("wall_seconds"), bool(res.get("timed_out"))))
    if len(flows) < 2:
        raise LabError(f"{f} has fewer than two flows: nothing to share")
    return [(res.get("name") or f.parent.name, [(res.get("name") or "run", flows)], res)]


def bound_table_for(path, jain: float = 0.78) -> list[str]:
    """`hoplab bound`: the Markdown table for a run or a reproduction directory."""
    return markdown([(label, draw_bound(res, variants, jain)) for label, variants, res in _draws(path)], jain)


def sim_bound_table(scenario, results: list, jain: float = 0.78) -> list[str]:
    """`hoplab bound --sim SCENARIO.toml RESULT.json...`: the bound for a simulator scenario
    whose topology lists its links (with `loss_ab` / `loss_ba`), over the routes each flow
    took (`flows[].route` of `hop-sim run --out`), beside each result's goodputs (bytes over
    the time from the flow's start to the run's end)."""
    import tomllib

    from ..topology import Topology

    try:
        sc = tomllib.loads(Path(scenario).read_text())
        topo = sc["topology"]
        t = Topology(int(topo["nodes"]), name=sc.get("name", "scenario"))
        links = topo.get("links") or []
        for link in links:
            t.add(int(link["a"]), int(link["b"]), float(link.get("loss_ab", link.get("loss", 0.0))),
                  link.get("loss_ba"))
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise LabError(f"cannot read the scenario {scenario}: {e}") from e
    if not links:
        raise LabError(f"{scenario} places its nodes rather than listing links: the bound needs the links")
    rate = float(topo.get("rate_mbps") or 11.0)
    draws = []
    for path in results:
        try:
            res = json.loads(Path(path).read_text())
            fl = res["flows"]
            end = float(res.get("virtual_seconds") or sc.get("duration"))
            paths = [[int(x) for x in f["route"]] for f in fl]
            pairs = [(int(f["src"]), int(f["dst"])) for f in fl]
            g = [int(f["bytes_delivered"]) * 8 / 1e6 / max(1e-3, end - float(f.get("start") or 0.0)) for f in fl]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise LabError(f"cannot read the simulator's result {path}: {e}") from e
        b = bound(t, pairs, rate, paths=paths)
        d = summary(b, [(str(res.get("seed", "run")), g)], jain)
        draws.append((f"{Path(path).name}", d))
    return markdown(draws, jain)
