"""gradexp's Hydra sweeper that finishes a sweep (gradexp/sweeps/resume.py); found by Hydra's plugin
discovery in the hydra_plugins namespace package."""
