"""gradexp's own local launcher: `python -m gradexp.train -m hydra/launcher=gradexp ...` trains a
sweep's runs of one structure together, in one compiled program (gradexp/training/engine.py), and
writes every run's directory as a separate run would. See gradexp_launcher.py."""
