"""`hoplab reproduce`: run the papers' experiments (hoplab.experiments) and write a report.

For every experiment, point (x value) and repetition the compared protocols run back to back
with the same spec apart from the protocol. Every row of experiments/paper.toml is then
measured from the valid runs:

- a statistic of one protocol (e.g. the median goodput over all measured flows of all its
  valid runs), or the ratio of one statistic between two protocols;
- its 95 % confidence interval by the bootstrap percentile method over repetitions: runs
  are resampled with replacement (the flows of one run stay together), for ratios the
  pairs of runs of the same repetition are resampled together; BOOT_RESAMPLES resamples
  with a fixed seed, so the report is deterministic. With fewer than 2 repetitions there is
  no interval; with few repetitions the interval is optimistic (it cannot be wider than the
  spread of the runs);
- the paper's figure and ours / paper.

Runs the lab marks invalid (lag bound exceeded) or that failed are left out of every figure
and counted per experiment and protocol. Rows whose protocol cannot run here say "not run"
and why.

The package by concern, each module importing only those above it: stats (the statistics
and their intervals), paper (the papers' figures), tables (the report's rows and tables
from run records), runner (planning and running), report (report.json, report.md, plots),
cli (the command).
"""
