"""Chaos: kill -9 of a random rank mid-collective (4 ranks, shared memory and TCP, every
collective, 24 seeds): every survivor raises RemoteError naming the dead rank within 10 s,
abort() returns within 5 s, nothing is left in /dev/shm, nothing hangs.  The worst times
over many seeds: ``python benchmarks/chaos.py`` (docs/reliability.md)."""

import _chaos
import pytest

SEEDS = range(24)


@pytest.mark.parametrize("seed", SEEDS)
def test_kill_a_rank_mid_collective(seed):
    transport = ("shm", "tcp")[seed % 2]
    collective = _chaos.COLLECTIVES[(seed // 2) % len(_chaos.COLLECTIVES)]
    result = _chaos.run(transport, collective, seed)
    assert not _chaos.problems(result), (transport, collective, result)
