"""gradexp's Hydra launcher on Ray: `python -m gradexp.train -m hydra/launcher=ray ...`.

Hydra finds it through the `hydra_plugins` namespace package; see ray_launcher.py for the
config and docs/guide/clusters.md for why gradexp has its own.
"""
