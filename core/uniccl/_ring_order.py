"""all_reduce that adds in gloo's ring order, so that float results equal gloo's bit for bit.

Floating-point addition is not associative: a sum over 3+ ranks depends on the order the
terms are added in.  gloo's ring allreduce (torch's "gloo" backend) splits the buffer into
one chunk per rank and adds chunk c as ((x[c-1] + x[c-2]) + ...) + x[c] (ranks mod n), the
partial sum travelling down the ring and ending on rank c.  Its chunk boundaries follow from
its segments: numSegments = roundUp(max(ceil(bytes / 1 MiB), 2n), n), segment bytes =
roundUp(ceil(bytes / numSegments), itemsize), chunk c = segments [c*spr, (c+1)*spr).

We reproduce the same sums with uniccl's own collectives, at a ring's traffic: an all_to_all
hands every rank the chunk it owns from every rank ((n-1)/n of the buffer, like a ring
reduce-scatter), the rank adds them locally in gloo's order, and an all_gather shares the
chunks.  Used by the torch backend.
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
        if numel == n * k:  # the chunks fill the buffer exactly: send it as it is
            send = flat
        else:
            send = self._buffer("send", flat, n * k)
            send[:numel] = flat
            send[numel:] = 0
        got = self._buffer("got", flat, n * k)
        comm.all_to_all(send, got)  # block j: rank j's values of my chunk
        block = [got[j * k:(j + 1) * k] for j in range(n)]
        acc = block[(me - 1) % n]
        combine = _ops(flat)[op]
        combine(acc, block[(me - 2) % n], out=acc)
        for step in range(3, n + 1):  # ranks me-3, ..., me-n+1, then me itself
            combine(acc, block[(me - step) % n], out=acc)
        comm.all_gather(acc, send)
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


def _ops(flat) -> dict:
    if isinstance(flat, np.ndarray):  # numpy: no thread pool to fight the ranks for the cores
        return {"sum": np.add, "prod": np.multiply}
    import torch
    return {"sum": torch.add, "prod": torch.mul}
