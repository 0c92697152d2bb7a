"""Fault injection for tests: ``UNICCL_FAULT_INJECT``, off (and free) unless set.

``UNICCL_FAULT_INJECT="flip=0.001,drop=0.0005,delay=0.01:0.2,kill_at=120,seed=7"``:

- ``flip=P``: a received TCP message has one random bit flipped with probability P (before
  its checksum is verified: the receiver asks for it again);
- ``shm_flip=P``: with UNICCL_SHM_CHECKSUM=1, a copy out of a peer's shared-memory slot has
  one bit flipped with probability P (the engine checks it and copies again);
- ``drop=P``: a received TCP message is thrown away with probability P (as if lost: asked
  for again);
- ``delay=P:S``: a received TCP message is held S seconds with probability P;
- ``disconnect=P``: the TCP connection a message arrives on is shut down with probability P,
  both processes living on (the connection is redialled and resumes: transport/tcp/heal.py);
- ``kill_at=N``: the process kills itself (SIGKILL) when it starts its N-th collective on a
  communicator (``kill_rank=R`` limits that to the job's rank R);
- ``slow=S``: the process sleeps S seconds before each collective it starts, a straggler
  (``slow_rank=R`` limits that to the job's rank R);
- ``seed=S``: the draws are seeded with S and the rank, so a run repeats exactly.
"""

from __future__ import annotations

import random

from .. import _env
from .._errors import InvalidArgument


class Faults:
    def __init__(self, spec: str, rank: int):
        self.flip = self.shm_flip = self.drop = self.delay_p = self.delay_s = self.disconnect = 0.0
        self.kill_at, self.kill_rank, seed = -1, -1, 0
        self.slow_s, self.slow_rank = 0.0, -1
        for item in filter(None, (x.strip() for x in spec.split(","))):
            key, _, value = item.partition("=")
            try:
                if key == "flip":
                    self.flip = float(value)
                elif key == "shm_flip":
                    self.shm_flip = float(value)
                elif key == "drop":
                    self.drop = float(value)
                elif key == "disconnect":
                    self.disconnect = float(value)
                elif key == "delay":
                    p, _, s = value.partition(":")
                    self.delay_p, self.delay_s = float(p), float(s or 0.1)
                elif key == "kill_at":
                    self.kill_at = int(value)
                elif key == "kill_rank":
                    self.kill_rank = int(value)
                elif key == "slow":
                    self.slow_s = float(value)
                elif key == "slow_rank":
                    self.slow_rank = int(value)
                elif key == "seed":
                    seed = int(value)
                else:
                    raise ValueError(f"unknown fault {key!r}")
            except ValueError as exc:
                raise InvalidArgument(
                    f"UNICCL_FAULT_INJECT={spec!r}: {exc}", op="init", argument="UNICCL_FAULT_INJECT"
                ) from None
        self.seed, self.rank = seed, rank
        self._rngs: dict = {}  # one stream of draws per sending peer: a run repeats exactly
        self.injected = {"flip": 0, "drop": 0, "delay": 0, "disconnect": 0}

    def rng(self, peer: int) -> random.Random:
        r = self._rngs.get(peer)
        if r is None:
            r = self._rngs[peer] = random.Random((self.seed * 1000003 + self.rank) * 1009 + peer)
        return r

    def on_message(self, peer: int) -> str:
        """What happens to the next message received from ``peer``: "", "flip", "drop", "delay" or
        "disconnect"."""
        x = self.rng(peer).random()
        if x < self.flip:
            return "flip"
        x -= self.flip
        if x < self.drop:
            return "drop"
        x -= self.drop
        if x < self.delay_p:
            return "delay"
        x -= self.delay_p
        if x < self.disconnect:
            return "disconnect"
        return ""

    def flip_bit(self, view, peer: int) -> None:
        """Flip one random bit of a writable byte view."""
        if len(view):
            rng = self.rng(peer)
            i = rng.randrange(len(view))
            view[i] ^= 1 << rng.randrange(8)

    def slow_for(self) -> float:
        """Seconds to sleep before a collective (``slow``), 0 when this rank is not the slow one."""
        return self.slow_s if self.slow_rank in (-1, self.rank) else 0.0

    def should_kill(self, seq: int) -> bool:
        return seq == self.kill_at and self.kill_rank in (-1, self.rank)


def from_env(rank: int) -> Faults | None:
    spec = _env.text("UNICCL_FAULT_INJECT")
    return Faults(spec, rank) if spec else None
