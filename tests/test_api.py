"""API semantics across real processes: async, groups, p2p, split, unique id, from_mpi."""

import pytest
from _launch import TRANSPORTS, check_ranks, rank_transports
from workers.api import CASES


@pytest.mark.parametrize("nranks,transport", rank_transports([1, 2, 3, 4]))
def test_api(nranks, transport):
    out = check_ranks(nranks, "api.py", *CASES, timeout=180, env=TRANSPORTS[transport])
    assert f"{len(CASES)} cases, 0 failures" in out, out[-4000:]
