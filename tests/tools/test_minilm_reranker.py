"""The stored rank head of the test reranker is what its fitting gives (refit here, so the JSON in
tools/data/ cannot drift from the procedure the tool documents), and ranks held-out answers first."""

from __future__ import annotations

import numpy as np
import pytest

from tools import minilm_gguf, minilm_reranker_gguf as reranker

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def test_the_stored_head_is_the_fitted_one():
    stored = reranker.stored_head()
    assert stored is not None, f"{reranker.HEAD_FILE} is missing or for another HEAD_VERSION: run --fit"
    fitted, (pairwise, top1) = reranker.fit_head(minilm_gguf.source_dir())
    for name, tensor in fitted.items():
        np.testing.assert_allclose(stored[name], tensor, atol=1e-4, err_msg=name)
    assert pairwise > 0.95 and top1 > 0.8
