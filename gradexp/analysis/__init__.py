"""The analysis side: a sweep's run directories → per-run metrics → groups against their
baseline → tables and plots. One concern per module, imported in this order (none imports a
later one):

    runs      finding and reading run directories (Run, load_runs)
    metrics   the per-run metrics, one small function each (run_metrics, Settings)
    groups    grouping keys, each run's group values, group labels and their order
    stats     the 95% intervals and the sign test (scipy.stats)
    compare   the per-run table, group counts, each group against its baseline (summarize),
              the largest stable learning rate of a learning-rate sweep (max_stable_lr)
    reports   the printed table and summary.md
    plots     the PNGs (matplotlib, imported only there)
    readme    a study README's generated blocks, which its report.py rewrites (imports none)

`python -m gradexp.summarize` is the command line over them. No TensorFlow (but to read event
files of a run without metrics.csv). This file imports nothing: import the modules themselves.
"""
