"""A search over a few settings with Optuna (`-m hydra/sweeper=optuna +search=clip_threshold`).

    space    the search space read from `hydra.sweeper` and the command line, checked before
             any run: its dimensions, the seeds each trial runs, the overrides of each job
    sweeper  the Hydra sweeper: Optuna's ask-and-tell loop over the launcher, one batch of
             trials at a time, each trial's configs checked before it runs; the history in
             the sweep's search.csv

A trial's value is measures.search_objective (a diverged run ranks last). Neither module
imports TensorFlow; only the sweeper imports Optuna (when the search starts).
"""
