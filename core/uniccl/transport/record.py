"""A call's record: what every rank of a collective must agree on before any data moves, and
the bytes every transport exchanges for it (shm: in the engine's control block; TCP: stamped
on the call's first messages; MPI: one persistent allgather).  Its size is the C engine's
(``UC_SHM_RECORD_WORDS`` in core/csrc/shm_engine.h, read through ``_shm``): the one definition.

Fields (int64 each): error (a local failure the peers must learn), collective, dtype, count,
op, root, the vendor library the rank would use (0: none), and whether it would reduce staged
device buffers with its own kernels.  The agreement itself lives in ``uniccl.comm``.
"""

from __future__ import annotations

import struct

from .shm._shm import COLL_CODES, RECORD_WORDS, RING_ORDER_FLAG

ERR, COLL, DTYPE, COUNT, OP, ROOT, NATIVE, DEVRED = range(8)
# the COLL field's codes: the collective at each index (part of the wire format: append only)
COLLECTIVES = (
    "barrier", "all_reduce", "reduce", "broadcast", "all_gather", "reduce_scatter", "all_to_all", "gather", "scatter",
)  # fmt: skip
assert len(COLLECTIVES) == COLL_CODES, "the C engine's UC_SHM_COLL_* codes are these, in this order"
assert DEVRED == RECORD_WORDS - 1, "the fields above fill the C engine's record exactly"
RECORD_BYTES = 8 * RECORD_WORDS
RECORD = struct.Struct(f"<{RECORD_WORDS}q")  # a record as bytes (little-endian int64 words)

__all__ = [
    "COLL",
    "COLLECTIVES",
    "COUNT",
    "DEVRED",
    "DTYPE",
    "ERR",
    "NATIVE",
    "OP",
    "RECORD",
    "RECORD_BYTES",
    "RECORD_WORDS",
    "RING_ORDER_FLAG",
    "ROOT",
]
