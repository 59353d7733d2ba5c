"""One run of a spec: the lab up, the flows, the lab down, the results assembled and written.

Everything that runs specs (the command line, `hoplab reproduce`, the self test) calls
`run_spec` here, below all of them: none of them imports another to reach it.
"""

from __future__ import annotations

from pathlib import Path

from . import lab, results
from .spec import Spec


def run_spec(sp: Spec, out: Path, progress=print) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    progress(f"hoplab: {sp.name}: {sp.topology.n} nodes, {len(sp.flows)} flows -> {out}")
    with lab.Lab(sp, out, progress) as lb:
        raw = lb.run()
    res = results.assemble(sp, raw)
    files = results.write(res, out)
    lag = res["lag"]
    progress(f"hoplab: lag max {lag['max_ms'] if lag['max_ms'] is None else round(lag['max_ms'], 1)} ms"
             f" -> run {'VALID' if res['valid'] else 'INVALID'}; wrote {', '.join(files)}")
    return res
