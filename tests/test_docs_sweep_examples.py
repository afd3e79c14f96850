"""The runnable blocks of the pages of sweeps (doc_blocks.SWEEP_PAGES), as
tests/test_docs_examples.py runs every other page's: a file of their own, so that
pytest-xdist runs them beside the others."""

from __future__ import annotations

import pytest

import doc_blocks


@pytest.mark.slow
@pytest.mark.parametrize("page", doc_blocks.runnable_pages(sweeps=True),
                         ids=lambda p: str(p.relative_to(doc_blocks.REPO)))
def test_the_examples_of_a_page_of_sweeps_run(page, tmp_path):
    assert doc_blocks.run_page(page, tmp_path) == doc_blocks.run_count(page) > 0
