"""Plans: each operation's arguments converted and checked on the caller's thread, and how to
run it once the ranks agree (step 1 of :mod:`uniccl.comm.communicator`'s three).

A builder takes the communicator and the public method's arguments and returns a
:class:`Plan`; a bad argument raises (``_call`` turns it into a plan carrying the error, so
that the peers learn it in the agreement).  A plan's ``run(OpContext)`` runs the point-to-point
algorithms (:mod:`.algorithms`), ``shm(engine)`` the shared-memory engine's collective, and
``engine``, where that runner is exactly one engine call, its arguments: the call can then
run as ``ShmEngine.agreed_call`` with the agreement riding on the data (one rendezvous, not two).
"""

from __future__ import annotations

from .._errors import InvalidArgument
from .._types import FLOATING, DType, MemcpyKind, ReduceOp
from ..transport.record import RING_ORDER_FLAG
from . import algorithms as alg
from . import checks as chk
from . import device as _device
from . import group as _group
from . import hosts as _hosts

RING_ORDER = -2  # a reduce_scatter's root field (in its record) when it combines in gloo's ring order
_SHM_RING_ORDER = RING_ORDER_FLAG  # ... and the flag on its op for the shm engine (from shm_engine.h)
_SUM_FOR_AVG = {ReduceOp.AVG: ReduceOp.SUM}  # by host, AVG is a SUM between the input's and the result's division
# The op the kernels see: AVG is SUM with a scale (before it for floats, after for integers).
_KERNEL_OP = {op: int(ReduceOp.SUM if op == ReduceOp.AVG else op) for op in ReduceOp}


class Plan:
    """A checked call, ready to run (or carrying the error that its checks found)."""

    __slots__ = (
        "name",
        "dtype",
        "count",
        "op",
        "root",
        "run",
        "shm",
        "nbytes",
        "error",
        "p2p",
        "post",
        "finish",
        "staged",
        "native",
        "args",
        "timeout",
        "entry",
        "engine",
        "result",
        "call",
        "hosts",
    )

    def __init__(self, name, dtype=-1, count=-1, op=-1, root=-1, run=None, shm=None, nbytes=0, p2p=False):
        self.name, self.dtype, self.count, self.op, self.root = name, dtype, count, op, root
        self.run = run  # run(OpContext): point-to-point algorithms (and the size-1 case)
        self.shm = shm  # shm(engine): the same collective on the shared-memory engine
        # (send, recv, n, dtype, op, root): ShmEngine.agreed_call's arguments when ``shm`` is that one
        # engine call (then ``result`` is what it returns); None when it does more (AVG, a copy first)
        self.engine = None
        self.result = None
        self.nbytes = nbytes  # what the tuner decides on
        self.error, self.p2p = None, p2p
        self.post = None  # point-to-point only: start the transfer, return its request
        self.finish = None  # ... and complete it
        self.staged = None  # device buffers seen through host mirrors (_device.Staged)
        self.native = None  # point-to-point through this vendor library (NativeNccl)
        self.args = ()  # the builder's arguments: the communicator, then the caller's (hierarchical path)
        self.timeout = None  # seconds (None: the communicator's)
        self.entry = None  # its flight-recorder entry
        self.call = None  # hooks.CallInfo when the communicator has hooks
        # hosts(comm.hosts, timeout): the call by host (comm/hosts.py), where it has that form
        self.hosts = None


def context(comm, plan: Plan, seq: int, algorithm: str) -> alg.OpContext:
    """What the point-to-point algorithms need for call ``seq`` of ``comm``."""
    dt = DType(plan.dtype)
    op = ReduceOp.SUM if plan.op == ReduceOp.AVG else plan.op
    return alg.OpContext(
        comm._t,
        comm.rank,
        comm.size,
        1 + seq % comm._tag_span,
        dt.itemsize,
        int(dt),
        int(op),
        comm._hostb.reduce,
        comm._scratch,
        comm._copy,
        algorithm,
        comm._chunk_bytes,
    )


def avg_input(comm, ptr: int, count: int, dtype: int, op) -> int:
    """Where a reduction reads this rank's input: for a float AVG, the input divided by
    the size first, in scratch (NCCL pre-multiplies likewise), so that the sum of values
    whose mean fits cannot overflow (float16 AVG of 30000 over 4 ranks was inf); the
    caller's buffer is left as it is.  Any other op, and integer AVG: ``ptr`` itself."""
    if op is not ReduceOp.AVG or not count or comm.size == 1 or dtype not in FLOATING:
        return ptr
    tmp = comm._scratch.get("avg", count * DType(dtype).itemsize)
    comm._hostb.scale(tmp, ptr, count, dtype, comm.size, None)
    return tmp


def finish_avg(comm, ptr: int, count: int, dtype: int, op) -> None:
    """Integer AVG: the sum divided (truncating) at the end; a float AVG was divided first."""
    if op is ReduceOp.AVG and count and (dtype not in FLOATING or comm.size == 1):
        comm._hostb.scale(ptr, ptr, count, dtype, comm.size, None)


def _engine(plan: Plan, result, send: int, recv: int, n: int, dtype: int, op: int, root: int) -> Plan:
    """Say that ``plan.shm`` is the one engine call with these arguments, returning ``result``."""
    plan.engine, plan.result = (send, recv, n, dtype, op, root), result
    return plan


def barrier(comm) -> Plan:
    """A barrier: nothing to check, nothing to move (the agreement is the barrier)."""
    return Plan("barrier")


def all_reduce(comm, sendbuf, recvbuf, op):
    name = "all_reduce"
    rop = chk.reduce_op(comm, op, name)
    kop = _KERNEL_OP[rop]
    send = chk.buffer(comm, sendbuf, name, "sendbuf", writable=recvbuf is None or recvbuf is sendbuf)
    recv = send
    if recvbuf is not None and recvbuf is not sendbuf:
        recv = chk.buffer(comm, recvbuf, name, "recvbuf", writable=True)
        chk.same_dtype(comm, send, recv, name, "recvbuf")
        chk.at_least(comm, recv, send.count, name, "recvbuf", "the count of sendbuf")
        chk.no_partial_overlap(comm, send, recv, name)
    count, result = send.count, sendbuf if recvbuf is None else recvbuf

    def run(c):
        comm._copy(recv.ptr, avg_input(comm, send.ptr, count, send.dtype, rop), send.nbytes)
        if c.size > 1 and count:
            if c.algorithm == "recursive_doubling" or count < c.size:
                alg.all_reduce_recursive_doubling(c, recv.ptr, count)
            else:
                alg.all_reduce_ring(c, recv.ptr, count)
        finish_avg(comm, recv.ptr, count, send.dtype, rop)
        return result

    def shm(e):
        e.all_reduce(avg_input(comm, send.ptr, count, send.dtype, rop), recv.ptr, count, send.dtype, kop)
        finish_avg(comm, recv.ptr, count, send.dtype, rop)
        return result

    def hosts(h, timeout):
        comm._copy(recv.ptr, avg_input(comm, send.ptr, count, send.dtype, rop), send.nbytes)
        _hosts.all_reduce(comm, h, recv.ptr, count, send.dtype, _SUM_FOR_AVG.get(rop, rop), timeout)
        finish_avg(comm, recv.ptr, count, send.dtype, rop)
        return result

    plan = Plan(name, send.dtype, count, rop, -1, run, shm, send.nbytes)
    if comm._hosts is not None and count and _hosts.numpy_ok(send.dtype):
        plan.hosts = hosts
    if rop is not ReduceOp.AVG:
        _engine(plan, result, send.ptr, recv.ptr, count, send.dtype, kop, -1)
    return plan


def reduce(comm, sendbuf, recvbuf, op, root):
    name = "reduce"
    rop = chk.reduce_op(comm, op, name)
    kop = _KERNEL_OP[rop]
    root = chk.rank_in_range(comm, root, name, "root")
    is_root = comm.rank == root
    inplace = is_root and (recvbuf is None or recvbuf is sendbuf)
    send = chk.buffer(comm, sendbuf, name, "sendbuf", writable=inplace)
    recv = send
    if is_root and not inplace:
        recv = chk.buffer(comm, recvbuf, name, "recvbuf", writable=True)
        chk.same_dtype(comm, send, recv, name, "recvbuf")
        chk.at_least(comm, recv, send.count, name, "recvbuf", "the count of sendbuf")
        chk.no_partial_overlap(comm, send, recv, name)
    count = send.count
    result = (sendbuf if recvbuf is None else recvbuf) if is_root else None

    def run(c):
        src = acc = avg_input(comm, send.ptr, count, send.dtype, rop)
        if is_root:
            acc = recv.ptr
            comm._copy(acc, src, send.nbytes)
        elif alg._tree((c.rank - root) % c.size, c.size)[1] and src == send.ptr:  # inner node:
            acc = c.scratch(0, send.nbytes)  # fold children into a copy, never the caller's input
            comm._copy(acc, src, send.nbytes)
        if c.size > 1 and count:
            alg.reduce_tree(c, src, acc, count, root)
        if is_root:
            finish_avg(comm, acc, count, send.dtype, rop)
        return result

    def shm(e):
        e.reduce(avg_input(comm, send.ptr, count, send.dtype, rop), recv.ptr, count, send.dtype, kop, root)
        if is_root:
            finish_avg(comm, recv.ptr, count, send.dtype, rop)
        return result

    plan = Plan(name, send.dtype, count, rop, root, run, shm, send.nbytes)
    if rop is not ReduceOp.AVG:
        _engine(plan, result, send.ptr, recv.ptr, count, send.dtype, kop, root)
    return plan


def broadcast(comm, buf, root):
    name = "broadcast"
    root = chk.rank_in_range(comm, root, name, "root")
    b = chk.buffer(comm, buf, name, "buf", writable=comm.rank != root)

    def run(c):
        if c.size > 1 and b.nbytes:
            alg.broadcast_tree(c, b.ptr, b.nbytes, root)
        return buf

    def shm(e):
        e.broadcast(b.ptr, b.nbytes, root)
        return buf

    return _engine(
        Plan(name, b.dtype, b.count, -1, root, run, shm, b.nbytes), buf, 0, b.ptr, b.nbytes, b.dtype, -1, root
    )


def all_gather(comm, sendbuf, recvbuf):
    name = "all_gather"
    send = chk.buffer(comm, sendbuf, name, "sendbuf", writable=False)
    recv = chk.buffer(comm, recvbuf, name, "recvbuf", writable=True)
    chk.same_dtype(comm, send, recv, name, "recvbuf")
    chk.at_least(comm, recv, comm.size * send.count, name, "recvbuf", "size x count of sendbuf")
    chk.no_partial_overlap(comm, send, recv, name, allowed_offset=comm.rank * send.nbytes)

    def run(c):
        comm._copy(recv.ptr + c.rank * send.nbytes, send.ptr, send.nbytes)
        if c.size > 1 and send.nbytes:
            alg.all_gather_ring(c, recv.ptr, send.nbytes)
        return recvbuf

    def shm(e):
        e.all_gather(send.ptr, recv.ptr, send.nbytes)
        return recvbuf

    def hosts(h, timeout):
        _hosts.all_gather(comm, h, send.ptr, recv.ptr, send.nbytes, timeout)
        return recvbuf

    plan = Plan(name, send.dtype, send.count, -1, -1, run, shm, comm.size * send.nbytes)
    if comm._hosts is not None and send.nbytes:
        plan.hosts = hosts
    return _engine(plan, recvbuf, send.ptr, recv.ptr, send.nbytes, send.dtype, -1, -1)


def reduce_scatter(comm, sendbuf, recvbuf, op, ring_order=False):
    name = "reduce_scatter"
    rop = chk.reduce_op(comm, op, name)
    kop = _KERNEL_OP[rop] | (_SHM_RING_ORDER if ring_order else 0)
    send = chk.buffer(comm, sendbuf, name, "sendbuf", writable=False)
    recv = chk.buffer(comm, recvbuf, name, "recvbuf", writable=True)
    if ring_order and (isinstance(send, _device.Staged) or isinstance(recv, _device.Staged)):
        raise InvalidArgument(
            "ring_order is for host buffers (a vendor library keeps its own order)",
            op=name,
            rank=comm.rank,
            argument="ring_order",
        )
    chk.same_dtype(comm, send, recv, name, "recvbuf")
    count = chk.divisible(comm, send, name, "sendbuf")
    chk.at_least(comm, recv, count, name, "recvbuf", "count of sendbuf / size")
    nbytes = count * DType(send.dtype).itemsize
    chk.no_partial_overlap(comm, recv, send, name, allowed_offset=comm.rank * nbytes)

    def run(c):
        if c.size == 1:
            comm._copy(recv.ptr, send.ptr, nbytes)
        elif count:
            src = avg_input(comm, send.ptr, count * c.size, send.dtype, rop)
            alg.reduce_scatter_ring(c, src, recv.ptr, count, reverse=ring_order)
        finish_avg(comm, recv.ptr, count, send.dtype, rop)
        return recvbuf

    def shm(e):
        e.reduce_scatter(
            avg_input(comm, send.ptr, count * comm.size, send.dtype, rop), recv.ptr, count, send.dtype, kop
        )
        finish_avg(comm, recv.ptr, count, send.dtype, rop)
        return recvbuf

    def hosts(h, timeout):
        src = avg_input(comm, send.ptr, count * comm.size, send.dtype, rop)
        _hosts.reduce_scatter(comm, h, src, recv.ptr, count, send.dtype, _SUM_FOR_AVG.get(rop, rop), timeout)
        finish_avg(comm, recv.ptr, count, send.dtype, rop)
        return recvbuf

    # the record's root field says the order (agreed: ranks asking for different orders
    # would get different bits)
    plan = Plan(name, send.dtype, count, rop, RING_ORDER if ring_order else -1, run, shm, send.nbytes)
    if comm._hosts is not None and count and not ring_order and _hosts.numpy_ok(send.dtype):
        plan.hosts = hosts
    if rop is not ReduceOp.AVG:
        _engine(plan, recvbuf, send.ptr, recv.ptr, count, send.dtype, kop, -1)
    return plan


def all_to_all(comm, sendbuf, recvbuf):
    name = "all_to_all"
    inplace = recvbuf is sendbuf
    send = chk.buffer(comm, sendbuf, name, "sendbuf", writable=inplace)
    recv = send if inplace else chk.buffer(comm, recvbuf, name, "recvbuf", writable=True)
    chk.same_dtype(comm, send, recv, name, "recvbuf")
    block = chk.divisible(comm, send, name, "sendbuf")
    chk.at_least(comm, recv, send.count, name, "recvbuf", "the count of sendbuf")
    chk.no_partial_overlap(comm, send, recv, name)
    bbytes = block * DType(send.dtype).itemsize

    def run(c):
        src = send.ptr
        if recv.ptr == send.ptr and c.size > 1:  # in place: send from a copy
            src = c.scratch(0, send.nbytes)
            comm._copy(src, send.ptr, send.nbytes)
        comm._copy(recv.ptr + c.rank * bbytes, src + c.rank * bbytes, bbytes)
        if c.size > 1 and bbytes:
            alg.all_to_all_pairwise(c, src, recv.ptr, bbytes)
        return recvbuf

    def shm(e):
        src = send.ptr
        if recv.ptr == send.ptr:  # in place: send from a copy
            src = comm._scratch(0, send.nbytes)
            comm._copy(src, send.ptr, send.nbytes)
        e.all_to_all(src, recv.ptr, bbytes)
        return recvbuf

    plan = Plan(name, send.dtype, block, -1, -1, run, shm, send.nbytes)
    if recv.ptr != send.ptr:
        _engine(plan, recvbuf, send.ptr, recv.ptr, bbytes, send.dtype, -1, -1)
    return plan


def gather(comm, sendbuf, recvbuf, root):
    name = "gather"
    root = chk.rank_in_range(comm, root, name, "root")
    send = chk.buffer(comm, sendbuf, name, "sendbuf", writable=False)
    recv = None
    if comm.rank == root:
        recv = chk.buffer(comm, recvbuf, name, "recvbuf", writable=True)
        chk.same_dtype(comm, send, recv, name, "recvbuf")
        chk.at_least(comm, recv, comm.size * send.count, name, "recvbuf", "size x count of sendbuf")
        chk.no_partial_overlap(comm, send, recv, name, allowed_offset=root * send.nbytes)

    def run(c):
        rptr = recv.ptr if recv is not None else 0
        if recv is not None:
            comm._copy(rptr + root * send.nbytes, send.ptr, send.nbytes)
        if c.size > 1 and send.nbytes:
            alg.gather_linear(c, send.ptr, rptr, send.nbytes, root)
        return recvbuf if recv is not None else None

    def shm(e):
        e.gather(send.ptr, recv.ptr if recv is not None else 0, send.nbytes, root)
        return recvbuf if recv is not None else None

    plan = Plan(name, send.dtype, send.count, -1, root, run, shm, comm.size * send.nbytes)
    rptr = recv.ptr if recv is not None else 0
    return _engine(plan, recvbuf if recv is not None else None, send.ptr, rptr, send.nbytes, send.dtype, -1, root)


def scatter(comm, sendbuf, recvbuf, root):
    name = "scatter"
    root = chk.rank_in_range(comm, root, name, "root")
    recv = chk.buffer(comm, recvbuf, name, "recvbuf", writable=True)
    send, count = None, recv.count
    if comm.rank == root:
        send = chk.buffer(comm, sendbuf, name, "sendbuf", writable=False)
        chk.same_dtype(comm, send, recv, name, "recvbuf")
        count = chk.divisible(comm, send, name, "sendbuf")
        chk.at_least(comm, recv, count, name, "recvbuf", "count of sendbuf / size")
        chk.no_partial_overlap(comm, recv, send, name, allowed_offset=root * count * DType(send.dtype).itemsize)
    bbytes = count * DType(recv.dtype).itemsize

    def run(c):
        sptr = send.ptr if send is not None else 0
        if send is not None:
            comm._copy(recv.ptr, sptr + root * bbytes, bbytes)
        if c.size > 1 and bbytes:
            alg.scatter_linear(c, sptr, recv.ptr, bbytes, root)
        return recvbuf

    def shm(e):
        e.scatter(send.ptr if send is not None else 0, recv.ptr, bbytes, root)
        return recvbuf

    plan = Plan(name, recv.dtype, count, -1, root, run, shm, comm.size * bbytes)
    return _engine(plan, recvbuf, send.ptr if send is not None else 0, recv.ptr, bbytes, recv.dtype, -1, root)


def _check_peer(comm, peer, name):
    peer = chk.rank_in_range(comm, peer, name, "peer")
    if peer == comm.rank and _group.current() is None:
        raise InvalidArgument(
            "a blocking send/recv with itself would deadlock; pair them inside uniccl.group()",
            op=name,
            rank=comm.rank,
            argument="peer",
        )
    return peer


def _p2p(comm, name, buf, peer):
    b = chk.buffer(comm, buf, name, "buf", writable=name == "recv")
    peer = _check_peer(comm, peer, name)
    if comm.native_p2p(b):
        return _native_p2p(comm, name, buf, b, peer)
    start = comm._t.isend if name == "send" else comm._t.irecv
    staged = isinstance(b, _device.Staged)
    tmp = []  # a device buffer moves through its own pinned copy (several may be in one group)

    def post():
        ptr = b.ptr
        if staged:
            ptr = comm._backend.host_alloc(max(1, b.nbytes))
            tmp.append(ptr)
            if name == "send" and b.nbytes:
                comm._backend.memcpy(ptr, b.dev_ptr, b.nbytes, int(MemcpyKind.DEVICE_TO_HOST), b.stream)
                if b.stream is not None:
                    comm._backend.stream_synchronize(b.stream)
        return start(ptr, b.nbytes, peer, 0, comm._t.p2p)

    def finish(req):
        try:
            comm._t.finish_p2p(req, peer, b.nbytes, name, comm.rank)
            if staged and name == "recv" and b.nbytes:
                comm._backend.memcpy(b.dev_ptr, tmp[0], b.nbytes, int(MemcpyKind.HOST_TO_DEVICE), b.stream)
                if b.stream is not None:
                    comm._backend.stream_synchronize(b.stream)
        finally:
            while tmp:
                comm._backend.host_free(tmp.pop())

    def run(_):
        finish(post())
        return buf

    plan = Plan(name, b.dtype, b.count, -1, peer, run, nbytes=b.nbytes, p2p=True)
    plan.post, plan.finish = post, finish
    return plan


def _native_p2p(comm, name, buf, b, peer):
    """send/recv of a device buffer through the vendor library (ncclSend/ncclRecv); inside
    uniccl.group() the group's transfers are issued between its group start and end."""
    args = {"send" if name == "send" else "recv": b.dev_ptr, "count": b.count, "dtype": b.dtype, "peer": peer}

    def post():
        comm._native.run(name, comm._native_comm, args, b.stream, comm.rank)

    def finish(_):
        if b.stream is None:  # as for collectives: a given stream orders it, no wait here
            comm._backend.stream_synchronize(None)

    def run(_):
        post()
        finish(None)
        return buf

    plan = Plan(name, b.dtype, b.count, -1, peer, run, nbytes=b.nbytes, p2p=True)
    plan.post, plan.finish, plan.native = post, finish, comm._native
    return plan


def send(comm, buf, peer):
    return _p2p(comm, "send", buf, peer)


def recv(comm, buf, peer):
    return _p2p(comm, "recv", buf, peer)
