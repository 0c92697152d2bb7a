"""No allocation per call in steady state: RSS stays flat over 10^4 collectives."""

import re

import pytest
from _launch import TRANSPORTS, check_ranks, rank_transports


@pytest.mark.parametrize("nranks,transport", rank_transports([2]))
def test_rss_flat_over_10k_calls(nranks, transport):
    out = check_ranks(nranks, "steady_state.py", "10000", timeout=300, env=TRANSPORTS[transport])
    growth = [int(g) for g in re.findall(r"rss_growth_kib (-?\d+)", out)]
    assert len(growth) == nranks, out
    assert max(growth) < 512, out  # KiB over the last 9000 calls
