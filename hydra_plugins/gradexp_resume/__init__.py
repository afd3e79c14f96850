"""gradexp's Hydra sweeper that finishes a sweep (gradexp/resume.py); found by Hydra's plugin
discovery in the hydra_plugins namespace package."""
