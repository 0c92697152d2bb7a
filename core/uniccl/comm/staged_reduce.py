"""Reducing collectives on staged device buffers, reduced by the platform's device kernels.

When the ranks stage (no native library, or it is disabled) and the platform has its
reduction kernels, bytes still move between ranks through the host transports, but the
arithmetic runs on the device: each rank gathers, into pinned host memory, the blocks it
has to combine (all_reduce: every rank's buffer; reduce: the root gathers; reduce_scatter:
an all_to_all of the blocks), copies them to device scratch on the buffer's stream and
folds them with the kernels in rank order — every rank's result is bitwise the same and
lands in the device buffer directly.  It trades the ring's 2(n-1)/n traffic for n-1
blocks per rank: a fallback for when the vendor library is not there, not a fast path.
"""

from __future__ import annotations

import ctypes

import numpy as np

from .._types import FLOATING, DType, MemcpyKind, ReduceOp
from . import device as _device
from . import plans as _plans

COLLECTIVES = frozenset(("all_reduce", "reduce", "reduce_scatter"))


def applies(comm, plan) -> bool:
    kernels = str(comm._backend.record.probe.get("kernels") or "none")
    return (
        plan.name in COLLECTIVES
        and plan.count > 0
        and _device.on_device(comm, plan)
        and not kernels.startswith("none")
        and comm._backend.mem_alloc is not None
    )


def _bytes(ptr: int, nbytes: int) -> np.ndarray:
    return np.frombuffer((ctypes.c_char * nbytes).from_address(ptr), np.uint8)


def run(comm, plan, seq: int):
    """Run ``plan`` (its staged buffers already copied to their host mirrors)."""
    be, n, name = comm._backend, comm.size, plan.name
    slots = {s.slot: s for s in plan.staged}
    send = slots["sendbuf"]
    recv = slots.get("recvbuf", send)
    count, isz = plan.count, DType(plan.dtype).itemsize
    block = count * isz
    gathered = comm._mirrors.get("gathered", n * block)
    root = plan.root
    if name == "all_reduce":
        inner = _plans.all_gather(comm, _bytes(send.ptr, block), _bytes(gathered, n * block))
    elif name == "reduce":
        inner = _plans.gather(
            comm, _bytes(send.ptr, block), _bytes(gathered, n * block) if comm.rank == root else None, root
        )
    else:  # reduce_scatter: block j of every rank comes to rank j
        inner = _plans.all_to_all(comm, _bytes(send.ptr, n * block), _bytes(gathered, n * block))
    comm._run_host(inner, seq)
    if name == "reduce" and comm.rank != root:
        return None
    stream, dst = send.stream, recv.dev_ptr
    scratch = comm._device_scratch.get("blocks", n * block)
    be.memcpy(scratch, gathered, n * block, int(MemcpyKind.HOST_TO_DEVICE), stream)
    if n == 1:
        be.memcpy(dst, scratch, block, int(MemcpyKind.DEVICE_TO_DEVICE), stream)
    kop = int(ReduceOp.SUM if plan.op == ReduceOp.AVG else plan.op)
    premul = plan.op == ReduceOp.AVG and n > 1 and plan.dtype in FLOATING
    if premul:  # float AVG: each block divided first, so a sum of values whose mean fits cannot overflow
        for q in range(n):
            be.scale(scratch + q * block, scratch + q * block, count, plan.dtype, n, stream)
    for q in range(1, n):  # rank order: the same sums, in the same order, on every rank
        be.reduce(dst, scratch if q == 1 else dst, scratch + q * block, count, plan.dtype, kop, stream)
    if plan.op == ReduceOp.AVG and not premul:  # integers: sum, then the truncating division
        be.scale(dst, dst, count, plan.dtype, n, stream)
    be.stream_synchronize(stream)
    return recv.obj
