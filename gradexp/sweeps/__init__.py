"""Many runs: Hydra's callbacks (callbacks), which runs share a program (grouping), a
pre-started worker (worker), resuming a sweep whole (resume) and the Optuna search (search).
Imports training, parts, config and runs."""
