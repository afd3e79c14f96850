"""Hydra instantiates only sweepers defined under hydra_plugins: gradexp's search sweeper, named
from here (the code: gradexp/sweeps/search/sweeper.py; its config:
conf/hydra/sweeper/optuna.yaml)."""

from gradexp.sweeps.search import sweeper


class SearchSweeper(sweeper.SearchSweeper):
    """gradexp.sweeps.search.sweeper.SearchSweeper, under the name Hydra accepts."""
