"""torch.distributed backend "uniccl": one line to switch.

    import uniccl.torch                      # registers the backend (needs torch: uniccl[torch])
    torch.distributed.init_process_group("uniccl")   # torchrun, env://, tcp://, a TCPStore

The backend is a Python ``ProcessGroup`` over a :class:`uniccl.Communicator`, bootstrapped
through torch's own store (rank 0 puts a :func:`uniccl.get_unique_id` there).  Tensors go to
uniccl as they are (zero-copy through the buffer protocol / DLPack); a non-contiguous tensor
is copied to a contiguous one and back.  A call with ``async_op=True`` runs on the group's
worker thread and returns a pending ``Work`` whose future gets the output tensors (what
DDP's communication hooks chain on); other calls run in the caller's thread.
"""

from __future__ import annotations

import functools
import os
import queue
import threading

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import _create_work_from_future
from torch.futures import Future

import uniccl

from . import _threads
from ._errors import InvalidArgument
from .bootstrap.rendezvous import torch_job_host
from .comm import ring_order as _ring_order
from .observability.log import logger

__all__ = ["ProcessGroupUniccl", "register"]

_OPS = {
    dist.ReduceOp.SUM: "sum",
    dist.ReduceOp.PRODUCT: "prod",
    dist.ReduceOp.MIN: "min",
    dist.ReduceOp.MAX: "max",
    dist.ReduceOp.AVG: "avg",
}


def _op_name(op) -> str:
    """``ReduceOp.BAND`` for torch's ReduceOp (an object whose str() is its address) or RedOpType."""
    kind = getattr(op, "op", op)  # ReduceOp wraps a RedOpType
    name = getattr(kind, "name", None)
    return f"ReduceOp.{name}" if name else repr(op)


def _op(opts, name: str) -> str:
    op = next((v for k, v in _OPS.items() if opts.reduceOp == k), None)
    if op is None:
        raise InvalidArgument(
            f"torch reduce op {_op_name(opts.reduceOp)} is not one uniccl has (SUM, PRODUCT, MIN, MAX, AVG)",
            op=name,
            argument="op",
        )
    return op


def _tensors(args):
    for a in args:
        if isinstance(a, torch.Tensor):
            yield a
        elif isinstance(a, (list, tuple)):
            yield from _tensors(a)


def _named_dtypes(body):
    """``body``, its "unsupported dtype" errors naming the torch dtype (``torch.bool``), not the
    DLPack code uniccl saw."""

    @functools.wraps(body)
    def named(self, *args, **kwargs):
        try:
            return body(self, *args, **kwargs)
        except InvalidArgument as exc:
            if "unsupported dtype" not in exc.message:
                raise
            seen = list(dict.fromkeys(str(t.dtype) for t in _tensors(list(args) + list(kwargs.values()))))
            text = exc.message.split("; supported: ", 1)
            known = set(text[1].split(", ")) if len(text) == 2 else set()
            bad = [d for d in seen if d.removeprefix("torch.") not in known] or seen
            if not bad:
                raise
            supported = f"; uniccl supports {text[1]}" if len(text) == 2 else ""
            raise InvalidArgument(
                f"torch dtype {', '.join(bad)} is not one uniccl has{supported}",
                op=exc.op,
                rank=exc.rank,
                argument=exc.argument,
                **exc.extra,
            ) from None

    return named


def _order(order: str | None) -> str:
    """all_reduce's float summation order: "gloo" (default; results bitwise equal to gloo's)
    or "native" (uniccl's own algorithms, fastest).  From the argument or UNICCL_TORCH_ORDER."""
    value = (order or os.environ.get("UNICCL_TORCH_ORDER") or "gloo").strip().lower()
    if value not in ("gloo", "native"):
        raise InvalidArgument(
            f"UNICCL_TORCH_ORDER={value!r}: expected 'gloo' or 'native'", op="init_process_group", argument="order"
        )
    return value


def _collective(body):
    """A ProcessGroup method from its synchronous ``body`` (which returns the output tensors).

    ``async_op=True`` (``opts.asyncOp``): the body runs on the group's worker thread and the
    Work is pending until it has (DDP overlaps its gradient all_reduces with the backward
    pass so); otherwise it runs in the caller's thread, behind any async calls still queued,
    and the Work returned is complete.  Every rank issues in the same order, and the worker
    runs in issue order: the collectives meet.  Point-to-point calls (no options) run in the
    caller's thread, after queued async calls.  A call made from the worker itself (a future's
    callback, as in PowerSGD's hooks) runs at once: queueing it there would wait for itself."""
    body = _named_dtypes(body)

    def method(self, *args, **kwargs):
        opts = kwargs.get("opts", args[-1] if args else None)
        worker = self._worker
        if worker.is_current() or not (getattr(opts, "asyncOp", False) or worker.pending()):
            fut = Future()  # run here, now
            fut.set_result(body(self, *args, **kwargs))
        else:
            fut = worker.submit(lambda: body(self, *args, **kwargs))
            if not getattr(opts, "asyncOp", False):
                fut.wait()  # a sync call queued behind async ones: done when it returns
        return _create_work_from_future(fut)

    method.__name__ = method.__qualname__ = body.__name__.replace("_sync_", "", 1)
    method.__doc__ = body.__doc__
    return method


class _Worker:
    """One thread per process group running async calls in issue order (started on first use)."""

    def __init__(self, name: str):
        self._name = name
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._count = 0  # submitted and not finished
        self._lock = threading.Lock()
        self._thread = None

    def pending(self) -> bool:
        return self._count > 0

    def is_current(self) -> bool:
        return self._thread is not None and threading.current_thread() is self._thread

    def submit(self, job) -> Future:
        fut = Future()
        with self._lock:
            self._count += 1
            if self._thread is None:
                self._thread = _threads.thread(self._loop, name=self._name)
                self._thread.start()
        self._queue.put((job, fut))
        return fut

    def _loop(self) -> None:
        while True:  # never ends on an error: later calls still need the thread
            job, fut = self._queue.get()
            try:
                try:
                    result = job()
                except BaseException as exc:  # the caller's wait() raises it
                    fut.set_exception(exc if isinstance(exc, Exception) else RuntimeError(repr(exc)))
                else:
                    fut.set_result(result)  # chained callbacks run here, on this thread
            except BaseException as exc:  # completing the future failed (a callback): keep going
                logger.warning("uniccl.torch: completing an async call's future failed: %r", exc)
            finally:
                with self._lock:
                    self._count -= 1


def _numpy_or_tensor(t: torch.Tensor):
    """A numpy view of a CPU tensor where numpy has its dtype (bfloat16: the tensor itself)."""
    try:
        return t.detach().numpy()
    except TypeError:
        return t


class _Contig:
    """A tensor as uniccl sees it: itself when contiguous, else a contiguous copy written back."""

    def __init__(self, t: torch.Tensor):
        self.orig, self.t = t, t if t.is_contiguous() else t.contiguous()

    def back(self) -> None:
        if self.t is not self.orig:
            self.orig.copy_(self.t)


def _flat(tensors) -> torch.Tensor:
    return torch.cat([t.reshape(-1) for t in tensors]) if tensors else torch.empty(0)


class ProcessGroupUniccl(dist.ProcessGroup):
    """torch's ProcessGroup interface over one uniccl communicator."""

    def __init__(self, comm: uniccl.Communicator, rank: int, size: int, order: str | None = None):
        super().__init__(rank, size)
        self.comm = comm
        self.order = _order(order)
        self._ring_order = _ring_order.GlooOrderAllReduce(comm)
        self._worker = _Worker(f"uniccl-pg-{rank}")

    def getBackendName(self) -> str:
        return "uniccl"

    def _gloo_order(self, t: torch.Tensor, op: str) -> bool:
        """Whether this all_reduce must add in gloo's order: only where order can change the
        result (a float sum or product over 3+ ranks)."""
        return (
            self.order == "gloo"
            and self.comm.size > 2
            and op in ("sum", "prod")
            and (t.is_floating_point() or t.is_complex())
            and t.numel() > 0
        )

    # ------------------------------------------------------------ reductions
    def _sync_allreduce(self, tensors, opts):
        op = _op(opts, "all_reduce")
        for t in tensors:
            c = _Contig(t)
            if self._gloo_order(c.t, op):
                self._ring_order(_numpy_or_tensor(c.t.reshape(-1)), op)
            else:
                self.comm.all_reduce(c.t, op=op)
            c.back()
        return tensors

    allreduce = _collective(_sync_allreduce)

    allreduce_coalesced = allreduce

    def _sync_reduce(self, tensors, opts):
        op = _op(opts, "reduce")
        for t in tensors:
            c = _Contig(t)
            out = c.t if self.comm.rank == opts.rootRank else None
            self.comm.reduce(c.t, out, op=op, root=opts.rootRank)
            if out is not None:
                c.back()
        return tensors

    reduce = _collective(_sync_reduce)

    def _sync__reduce_scatter_base(self, output, input, opts):
        out, src = _Contig(output), _Contig(input)
        self.comm.reduce_scatter(src.t, out.t, op=_op(opts, "reduce_scatter"))
        out.back()
        return [output]

    _reduce_scatter_base = _collective(_sync__reduce_scatter_base)

    reduce_scatter_single = _reduce_scatter_base  # torch >= 2.13 (reduce_scatter_tensor)

    def _sync_reduce_scatter_single_coalesced(self, outputs, inputs, opts):
        for o, i in zip(outputs, inputs):
            self._sync__reduce_scatter_base(o, i, opts)
        return outputs

    reduce_scatter_single_coalesced = _collective(_sync_reduce_scatter_single_coalesced)

    def _sync_reduce_scatter(self, output_tensors, input_tensors, opts):
        for out, ins in zip(output_tensors, input_tensors):
            o = _Contig(out)
            self.comm.reduce_scatter(_flat(ins), o.t, op=_op(opts, "reduce_scatter"))
            o.back()
        return output_tensors

    reduce_scatter = _collective(_sync_reduce_scatter)

    # ------------------------------------------------------------ gathers
    def _sync__allgather_base(self, output, input, opts):
        out = _Contig(output)
        self.comm.all_gather(_Contig(input).t, out.t)
        out.back()
        return [output]

    _allgather_base = _collective(_sync__allgather_base)

    def _sync_allgather(self, output_tensors, input_tensors, opts):
        for outs, t in zip(output_tensors, input_tensors):
            flat = torch.empty(t.numel() * self.comm.size, dtype=t.dtype)
            self.comm.all_gather(_Contig(t).t, flat)
            for r, o in enumerate(outs):
                o.copy_(flat[r * t.numel() : (r + 1) * t.numel()].view_as(o))
        return output_tensors

    allgather = _collective(_sync_allgather)

    all_gather_single = _allgather_base  # torch >= 2.13 names (all_gather_into_tensor)

    def _sync_allgather_into_tensor_coalesced(self, outputs, inputs, opts):
        for o, i in zip(outputs, inputs):
            self._sync__allgather_base(o, i, opts)
        return outputs

    allgather_into_tensor_coalesced = _collective(_sync_allgather_into_tensor_coalesced)

    all_gather_single_coalesced = allgather_into_tensor_coalesced

    def _sync_gather(self, output_tensors, input_tensors, opts):
        root, me = opts.rootRank, self.comm.rank
        t = input_tensors[0]
        flat = torch.empty(t.numel() * self.comm.size, dtype=t.dtype) if me == root else None
        self.comm.gather(_Contig(t).t, flat, root=root)
        if me == root:
            for r, o in enumerate(output_tensors[0]):
                o.copy_(flat[r * t.numel() : (r + 1) * t.numel()].view_as(o))
        return output_tensors

    gather = _collective(_sync_gather)

    def _sync_scatter(self, output_tensors, input_tensors, opts):
        root, me = opts.rootRank, self.comm.rank
        out = _Contig(output_tensors[0])
        self.comm.scatter(_flat(input_tensors[0]) if me == root else None, out.t, root=root)
        out.back()
        return output_tensors

    scatter = _collective(_sync_scatter)

    def _sync_broadcast(self, tensors, opts):
        for t in tensors:
            c = _Contig(t)
            self.comm.broadcast(c.t, root=opts.rootRank)
            c.back()
        return tensors

    broadcast = _collective(_sync_broadcast)

    # ------------------------------------------------------------ all to all
    def _sync_alltoall_base(self, output, input, output_split_sizes, input_split_sizes, opts):
        n = self.comm.size
        if not output_split_sizes and not input_split_sizes:  # equal blocks: one uniccl call
            out = _Contig(output)
            self.comm.all_to_all(_Contig(input).t, out.t)
            out.back()
            return [output]
        # uneven splits: point-to-point, every rank to every rank, in a group (no deadlock)
        row = input.numel() // max(1, input.shape[0]) if input.dim() else 1
        ins = input_split_sizes or [input.shape[0] // n] * n
        outs = output_split_sizes or [output.shape[0] // n] * n
        src, dst = _Contig(input), _Contig(output)
        s_off = [sum(ins[:r]) * row for r in range(n)]
        d_off = [sum(outs[:r]) * row for r in range(n)]
        sflat, dflat = src.t.reshape(-1), dst.t.reshape(-1)
        with uniccl.group():
            for r in range(n):
                if r == self.comm.rank:
                    continue
                if ins[r]:
                    self.comm.send(sflat[s_off[r] : s_off[r] + ins[r] * row], r)
                if outs[r]:
                    self.comm.recv(dflat[d_off[r] : d_off[r] + outs[r] * row], r)
        me = self.comm.rank
        dflat[d_off[me] : d_off[me] + outs[me] * row].copy_(sflat[s_off[me] : s_off[me] + ins[me] * row])
        dst.back()
        return [output]

    alltoall_base = _collective(_sync_alltoall_base)

    all_to_all_single = alltoall_base

    def _sync_alltoall(self, output_tensors, input_tensors, opts):
        flat_in = _flat(input_tensors)
        flat_out = torch.empty(sum(t.numel() for t in output_tensors), dtype=flat_in.dtype)
        if len({t.numel() for t in input_tensors}) == 1 and len({t.numel() for t in output_tensors}) == 1:
            self.comm.all_to_all(flat_in, flat_out)
        else:
            self._sync_alltoall_base(
                flat_out, flat_in, [t.numel() for t in output_tensors], [t.numel() for t in input_tensors], opts
            )
        off = 0
        for t in output_tensors:
            t.copy_(flat_out[off : off + t.numel()].view_as(t))
            off += t.numel()
        return output_tensors

    alltoall = _collective(_sync_alltoall)

    # ------------------------------------------------------------ point to point
    def _sync_send(self, tensors, dst, tag):
        for t in tensors:
            self.comm.send(_Contig(t).t, dst)
        return tensors

    send = _collective(_sync_send)

    def _sync_recv(self, tensors, src, tag):
        for t in tensors:
            c = _Contig(t)
            self.comm.recv(c.t, src)
            c.back()
        return tensors

    recv = _collective(_sync_recv)

    def _sync_barrier(self, opts=None):
        self.comm.barrier()
        return []

    barrier = _collective(_sync_barrier)


def _create(store, rank: int, size: int, timeout) -> ProcessGroupUniccl:
    """torch's backend factory: the ranks meet through ``store`` (per group: torch prefixes it)."""
    if rank == 0:
        store.set("uniccl_uid", bytes(uniccl.get_unique_id(host=torch_job_host())))  # loopback: one host
    store.wait(["uniccl_uid"])
    uid = store.get("uniccl_uid")
    seconds = timeout.total_seconds() if timeout is not None else None
    comm = uniccl.Communicator(uid, rank, size, timeout=seconds)
    return ProcessGroupUniccl(comm, rank, size)


def register() -> None:
    """Make ``"uniccl"`` a torch.distributed backend (done on import; idempotent)."""
    if "uniccl" not in dist.Backend.backend_list:
        dist.Backend.register_backend("uniccl", _create, devices=["cpu"])


register()
