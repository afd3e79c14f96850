"""Hydra instantiates only sweepers defined under hydra_plugins: gradexp's search sweeper, named
from here (the code: gradexp/search/sweeper.py; its config: conf/hydra/sweeper/optuna.yaml)."""

from gradexp.search import sweeper


class SearchSweeper(sweeper.SearchSweeper):
    """gradexp.search.sweeper.SearchSweeper, under the name Hydra accepts."""
