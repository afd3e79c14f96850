"""Training K runs at once (one run is K = 1): the step (step), the loop's compiled program
(engine), what is measured and logged (telemetry, tracking, logs), spike and divergence
handling (spikes, stopping), checkpoints (checkpoints, checkpoint_fallback), devices (devices)
and model.fit's step measured the same way (fit_step, fit_config). Imports parts, config and
runs."""
