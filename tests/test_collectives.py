"""Differential matrix: every collective x 12 dtypes x 5 ops x sizes (the big sizes for a subset:
workers/matrix.py runs_big), in and out of place,
at 1, 2, 3 and 4 real processes, against numpy (float64 / exact integers)."""

import pytest
from _launch import TRANSPORTS, check_ranks, rank_transports

COLLECTIVES = ["all_reduce", "reduce", "broadcast", "all_gather", "reduce_scatter", "all_to_all", "gather", "scatter"]


@pytest.mark.parametrize("collective", COLLECTIVES)
@pytest.mark.parametrize("nranks,transport", rank_transports([1, 2, 3, 4]))
def test_matrix(collective, nranks, transport):
    out = check_ranks(nranks, "matrix.py", collective, timeout=600, env=TRANSPORTS[transport])
    assert "0 failures" in out, out[-3000:]
