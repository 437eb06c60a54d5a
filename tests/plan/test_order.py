"""plan.order packs sort columns into few words and radix-sorts small ones; the result
must be exactly np.lexsort's permutation (stable), whatever the column widths."""

from __future__ import annotations

import numpy as np
import pytest

from ckptbench.plan.order import lex_order, stable_argsort


@pytest.mark.parametrize("seed", range(20))
def test_lex_order_is_lexsort(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(0, 400))
    tops = [1, 2, 7, 300, 70_000, 1 << 20, 1 << 40]
    columns = [rng.integers(0, int(rng.choice(tops)), n) for _ in range(int(rng.integers(1, 8)))]
    want = np.lexsort(columns) if n else np.zeros(0, dtype=np.int64)
    assert np.array_equal(lex_order(columns), want)


@pytest.mark.parametrize("top", [1, 60_000, 1 << 31, 1 << 50])
def test_stable_argsort_keeps_ties_in_order(top: int) -> None:
    values = np.random.default_rng(top % 97).integers(0, min(top, 50), 1000) * (top // 50 or 1)
    assert np.array_equal(stable_argsort(values), np.argsort(values, kind="stable"))
