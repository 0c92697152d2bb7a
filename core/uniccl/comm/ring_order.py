"""all_reduce that adds in gloo's ring order, so that float results equal gloo's bit for bit.

Floating-point addition is not associative: a sum over 3+ ranks depends on the order the
terms are added in.  gloo's ring allreduce (torch's "gloo" backend) splits the buffer into
one chunk per rank and adds chunk c as ((x[c-1] + x[c-2]) + ...) + x[c] (ranks mod n), the
partial sum travelling down the ring and ending on rank c.  Its chunk boundaries follow from
its segments: numSegments = roundUp(max(ceil(bytes / 1 MiB), 2n), n), segment bytes =
roundUp(ceil(bytes / numSegments), itemsize), chunk c = segments [c*spr, (c+1)*spr).

We reproduce the same sums with uniccl's own collectives on gloo's chunks: a reduce_scatter
with ``ring_order=True`` (the shared-memory engine folds each block in that order; the TCP
and MPI paths run the ring in gloo's direction), then an all_gather.  Used by the torch
backend.
"""

from __future__ import annotations

import numpy as np

_MAX_SEGMENT = 1 << 20  # gloo's AllreduceOptions kMaxSegmentSize


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def chunk_elements(numel: int, itemsize: int, n: int) -> int:
    """Elements per rank's chunk in gloo's ring for ``numel`` items (the last chunks may be short)."""
    total = numel * itemsize
    max_seg = itemsize * max(1, _MAX_SEGMENT // itemsize)
    segments = _round_up(max(-(-total // max_seg), 2 * n), n)
    seg_bytes = _round_up(-(-total // segments), itemsize)
    return (segments // n) * seg_bytes // itemsize


class GlooOrderAllReduce:
    """all_reduce in gloo's order over one communicator; keeps its scratch buffers between
    calls (fresh pages for every call cost more than the copies)."""

    def __init__(self, comm):
        self.comm = comm
        self._scratch: dict = {}

    def __call__(self, flat, op: str) -> None:
        """In-place all_reduce of the 1-D contiguous array ``flat`` (numpy, or a torch tensor for
        dtypes numpy lacks) with ``op`` ("sum" or "prod"), each element combined in gloo's order."""
        comm = self.comm
        n, me, numel = comm.size, comm.rank, len(flat)
        k = chunk_elements(numel, flat.itemsize, n)
        if numel == n * k:  # the chunks fill the buffer exactly: use it as it is
            send = flat
        else:
            send = self._buffer("send", flat, n * k)
            send[:numel] = flat
            send[numel:] = 0
        mine = send[me * k : (me + 1) * k]
        comm.reduce_scatter(send, mine, op, ring_order=True)  # in place: my chunk, reduced
        comm.all_gather(mine, send)  # in place too
        if send is not flat:
            flat[:] = send[:numel]

    def _buffer(self, name: str, like, count: int):
        key = (name, str(like.dtype), isinstance(like, np.ndarray))
        buf = self._scratch.get(key)
        if buf is None or len(buf) < count:
            buf = self._scratch[key] = _empty_like(like, count)
        return buf[:count]


def _empty_like(flat, count: int):
    if isinstance(flat, np.ndarray):
        return np.empty(count, dtype=flat.dtype)
    import torch

    return torch.empty(count, dtype=flat.dtype)
