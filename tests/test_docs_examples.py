"""Every runnable block of README.md and docs/ (but the pages of sweeps:
tests/test_docs_sweep_examples.py) runs, page by page, in a temporary directory, at a small
scale (tests/doc_blocks.py says how); a console block prints exactly what it shows."""

from __future__ import annotations

import pytest

import doc_blocks


@pytest.mark.slow
@pytest.mark.parametrize("page", doc_blocks.runnable_pages(sweeps=False),
                         ids=lambda p: str(p.relative_to(doc_blocks.REPO)))
def test_the_examples_of_a_page_run(page, tmp_path):
    assert doc_blocks.run_page(page, tmp_path) == doc_blocks.run_count(page) > 0
