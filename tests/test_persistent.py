"""Persistent collectives (``comm.all_reduce_init(...)``, ``req.start()``, ``req.wait()``) on
every transport, as users run them (tests/workers/persistent.py checks each against numpy)."""

import re

import pytest
from _launch import TRANSPORTS, rank_transports, run_ranks


@pytest.mark.parametrize("n,transport", rank_transports([2, 4]))
def test_persistent_collectives_match_numpy_and_refuse_misuse(n, transport):
    res = run_ranks(n, "persistent.py", timeout=240, env=TRANSPORTS[transport])
    assert res.returncode == 0, res.stdout[-4000:]
    found = re.findall(r"rank (\d+): ok (\d+) blocks=(-?\d+)", res.stdout)
    assert sorted(int(q) for q, _, _ in found) == list(range(n)), res.stdout[-4000:]
    for _, served, blocks in found:
        assert int(blocks) < 200, res.stdout[-2000:]  # 10^4 starts: one allocation each would be 10^4
        if transport == "shm":
            assert int(served) > 10000  # the starts went from start() to the engine compiled
        else:
            assert int(served) == 0  # TCP and MPI: the ordinary call, checked each time
