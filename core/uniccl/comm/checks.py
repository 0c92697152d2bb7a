"""Argument conversion and checks shared by every operation.

Each helper raises ``InvalidArgument`` naming the operation, the rank, the
argument and what was expected versus what was given.
"""

from __future__ import annotations

from .._errors import InvalidArgument
from .._types import DLDeviceType, ReduceOp, dtype_name, op_from_any
from . import device as _device
from ._buffer import as_buffer

_OP_CHOICES = ", ".join(o.name.lower() for o in ReduceOp)
_CPU = int(DLDeviceType.CPU)
# the usual spellings
_OPS: dict[ReduceOp | str, ReduceOp] = {**{o: o for o in ReduceOp}, **{o.name.lower(): o for o in ReduceOp}}


def buffer(comm, obj, op: str, argument: str, writable: bool):
    if obj is None:
        raise InvalidArgument("a buffer is required here, got None", op=op, rank=comm.rank, argument=argument)
    buf = as_buffer(obj, op, argument, comm.rank, writable)
    if buf.device_type != _CPU:
        claim = comm._backend.claim_pointer
        device = claim(buf.ptr, buf.device_type, buf.device_id) if claim is not None else None
        if device is None:
            raise InvalidArgument(
                f"buffer lives on DLPack device type {buf.device_type}, which the "
                f"'{comm.platform}' platform of this communicator does not own",
                op=op,
                rank=comm.rank,
                argument=argument,
            )
        return _device.stage(comm, buf, device, argument, writable)
    return buf


def reduce_op(comm, op, opname: str) -> ReduceOp:
    found = _OPS.get(op) if isinstance(op, (str, ReduceOp)) else None
    if found is None:
        found = op_from_any(op)
    if found is None:
        raise InvalidArgument(
            f"unknown reduction op {op!r}; expected one of {_OP_CHOICES}", op=opname, rank=comm.rank, argument="op"
        )
    return found


def rank_in_range(comm, value, opname: str, argument: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < comm.size:
        raise InvalidArgument(
            f"must be an int in [0, {comm.size}), got {value!r}", op=opname, rank=comm.rank, argument=argument
        )
    return value


def same_dtype(comm, a, b, opname: str, argument: str) -> None:
    if a.dtype != b.dtype:
        raise InvalidArgument(
            f"dtype {dtype_name(b.dtype)} differs from the send buffer's {dtype_name(a.dtype)}",
            op=opname,
            rank=comm.rank,
            argument=argument,
        )


def at_least(comm, buf, count: int, opname: str, argument: str, why: str) -> None:
    if buf.count < count:
        raise InvalidArgument(
            f"too small: holds {buf.count} elements, needs {count} ({why})",
            op=opname,
            rank=comm.rank,
            argument=argument,
        )


def divisible(comm, buf, opname: str, argument: str) -> int:
    if buf.count % comm.size:
        raise InvalidArgument(
            f"holds {buf.count} elements, not a multiple of the communicator size {comm.size}",
            op=opname,
            rank=comm.rank,
            argument=argument,
        )
    return buf.count // comm.size


def no_partial_overlap(comm, a, b, opname: str, allowed_offset: int = 0) -> None:
    """Reject send/recv ranges that overlap other than in the documented in-place way
    (``b.ptr + allowed_offset == a.ptr``)."""
    if a.nbytes == 0 or b.nbytes == 0 or a.ptr == b.ptr + allowed_offset:
        return
    if a.ptr < b.ptr + b.nbytes and b.ptr < a.ptr + a.nbytes:
        raise InvalidArgument(
            "send and receive buffers overlap (only the documented in-place layout is allowed)",
            op=opname,
            rank=comm.rank,
            argument="recvbuf",
        )
