"""API semantics across real processes: async, groups, p2p, split, unique id, from_mpi."""
import pytest

from _launch import check_ranks, rank_counts
from workers.api import CASES


@pytest.mark.parametrize("nranks", rank_counts([1, 2, 3, 4]))
def test_api(nranks):
    out = check_ranks(nranks, "api.py", *CASES, timeout=180)
    assert f"{len(CASES)} cases, 0 failures" in out, out[-4000:]
