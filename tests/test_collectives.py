"""Differential matrix: every collective x 12 dtypes x 5 ops x sizes, in and out of place,
at 1, 2, 3 and 4 real processes, against numpy (float64 / exact integers)."""
import pytest

from _launch import check_ranks, rank_counts

COLLECTIVES = ["all_reduce", "reduce", "broadcast", "all_gather", "reduce_scatter", "all_to_all",
               "gather", "scatter"]


@pytest.mark.parametrize("collective", COLLECTIVES)
@pytest.mark.parametrize("nranks", rank_counts([1, 2, 3, 4]))
def test_matrix(collective, nranks):
    out = check_ranks(nranks, "matrix.py", collective, timeout=600)
    assert "0 failures" in out, out[-3000:]
