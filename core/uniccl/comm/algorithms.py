"""Device-agnostic collective algorithms.

Each function moves bytes through a transport (``c.t``: isend/irecv/waitall on
addresses) and reduces with the platform's kernel (``c.reduce``), on element
ranges of host-visible memory.  Large transfers are cut into chunks so that the
reduction of one chunk overlaps the transfer of the next.

Reductions combine ``op(local, received)``; every op is commutative (IEEE + and *
included), so ranks that combine the same values in mirrored order get bitwise
identical results.
"""

from __future__ import annotations

from .. import _env

DEFAULT_CHUNK_BYTES = 512 * 1024


def chunk_bytes() -> int:
    """UNICCL_CHUNK_BYTES (at least 4096): read when a communicator is made, not per call."""
    return max(4096, _env.size("UNICCL_CHUNK_BYTES"))


class OpContext:
    """What one collective call needs: transport, tag, kernel, scratch space."""

    __slots__ = (
        "t",
        "rank",
        "size",
        "tag",
        "itemsize",
        "dtype",
        "op",
        "_reduce",
        "scratch",
        "chunk",
        "copy",
        "algorithm",
    )

    def __init__(
        self, t, rank, size, tag, itemsize, dtype, op, reduce_fn, scratch, copy_fn, algorithm="", chunk_nbytes=None
    ):
        self.t, self.rank, self.size, self.tag, self.algorithm = t, rank, size, tag, algorithm
        self.itemsize, self.dtype, self.op = itemsize, dtype, op
        self._reduce, self.scratch, self.copy = reduce_fn, scratch, copy_fn
        self.chunk = max(1, (chunk_nbytes or chunk_bytes()) // itemsize)  # in elements

    def reduce(self, dst: int, a: int, b: int, count: int) -> None:
        if count:
            self._reduce(dst, a, b, count, self.dtype, self.op, None)


def segments(count: int, parts: int):
    """Split ``count`` elements into ``parts`` near-equal ranges: (offsets, lengths)."""
    q, rem = divmod(count, parts)
    lens = [q + (1 if i < rem else 0) for i in range(parts)]
    offs, acc = [], 0
    for n in lens:
        offs.append(acc)
        acc += n
    return offs, lens


def _chunks(count: int, chunk: int):
    return [(o, min(chunk, count - o)) for o in range(0, count, chunk)] or [(0, 0)]


def _isend(c, ptr, nbytes, peer):
    return c.t.isend(ptr, nbytes, peer, c.tag)


def _irecv(c, ptr, nbytes, peer):
    return c.t.irecv(ptr, nbytes, peer, c.tag)


def _isend_chunked(c, ptr: int, count: int, peer: int):
    """Send ``count`` elements in the chunks that ``_recv_reduce`` expects."""
    isz = c.itemsize
    return [_isend(c, ptr + o * isz, n * isz, peer) for o, n in _chunks(count, c.chunk)]


def _recv_reduce(c, dst: int, own: int, tmp: int, count: int, peer: int) -> None:
    """Receive ``count`` elements from ``peer`` chunk by chunk into ``tmp``; as each
    chunk lands, ``dst = op(own, chunk)``."""
    isz = c.itemsize
    parts = _chunks(count, c.chunk)
    reqs = [_irecv(c, tmp + o * isz, n * isz, peer) for o, n in parts]
    for (o, n), req in zip(parts, reqs):
        c.t.wait(req)
        c.reduce(dst + o * isz, own + o * isz, tmp + o * isz, n)


# ------------------------------------------------------------------ all_reduce
def all_reduce_ring(c, ptr: int, count: int) -> None:
    """Ring reduce-scatter then ring all-gather: 2(n-1)/n of the data per rank."""
    n, r, isz = c.size, c.rank, c.itemsize
    offs, lens = segments(count, n)
    right, left = (r + 1) % n, (r - 1) % n
    tmp = c.scratch(0, max(lens) * isz)
    for s in range(n - 1):  # after this loop rank r owns segment r+1, fully reduced
        si, ri = (r - s) % n, (r - s - 1) % n
        sreqs = _isend_chunked(c, ptr + offs[si] * isz, lens[si], right)
        seg = ptr + offs[ri] * isz
        _recv_reduce(c, seg, seg, tmp, lens[ri], left)
        c.t.waitall(sreqs)
    for s in range(n - 1):
        si, ri = (r - s + 1) % n, (r - s) % n
        reqs = [
            _isend(c, ptr + offs[si] * isz, lens[si] * isz, right),
            _irecv(c, ptr + offs[ri] * isz, lens[ri] * isz, left),
        ]
        c.t.waitall(reqs)


def all_reduce_recursive_doubling(c, ptr: int, count: int) -> None:
    """log2(n) exchanges of the whole buffer: latency-optimal for small data.

    For n not a power of two the first 2*(n - p) ranks pair up (p = largest power
    of two <= n): the even one hands its data to the odd one and waits for the
    result, leaving p ranks for the doubling."""
    n, r = c.size, c.rank
    nbytes = count * c.itemsize
    tmp = c.scratch(0, nbytes)
    p = 1 << (n.bit_length() - 1)
    rem = n - p
    if r < 2 * rem:
        if r % 2 == 0:
            c.t.waitall([_isend(c, ptr, nbytes, r + 1)])
            c.t.waitall([_irecv(c, ptr, nbytes, r + 1)])
            return
        c.t.waitall([_irecv(c, tmp, nbytes, r - 1)])
        c.reduce(ptr, ptr, tmp, count)
        vr = r // 2
    else:
        vr = r - rem
    mask = 1
    while mask < p:
        vpeer = vr ^ mask
        peer = vpeer * 2 + 1 if vpeer < rem else vpeer + rem
        c.t.waitall([_isend(c, ptr, nbytes, peer), _irecv(c, tmp, nbytes, peer)])
        c.reduce(ptr, ptr, tmp, count)
        mask <<= 1
    if r < 2 * rem:
        c.t.waitall([_isend(c, ptr, nbytes, r - 1)])


# -------------------------------------------------------------- trees (root ops)
def _tree(vr: int, n: int):
    """Binomial tree over virtual ranks (root = 0): (parent or None, children)."""
    parent = None if vr == 0 else vr & (vr - 1)
    limit = (vr & -vr) if vr else 1 << max(n - 1, 0).bit_length()
    children, m = [], 1
    while m < limit and vr + m < n:
        children.append(vr + m)
        m <<= 1
    return parent, children


def broadcast_tree(c, ptr: int, nbytes: int, root: int) -> None:
    """Binomial tree, pipelined: each chunk is forwarded as soon as it arrives."""
    n, r = c.size, c.rank
    vr = (r - root) % n
    parent, children = _tree(vr, n)
    real = [(ch + root) % n for ch in reversed(children)]  # biggest subtree first
    parts = _chunks(nbytes, c.chunk * c.itemsize)
    rreqs = [_irecv(c, ptr + o, k, (parent + root) % n) for o, k in parts] if parent is not None else None
    sreqs: list[object] = []  # the transport's requests
    for i, (o, k) in enumerate(parts):
        if rreqs is not None:
            c.t.wait(rreqs[i])
        sreqs.extend(_isend(c, ptr + o, k, ch) for ch in real)
    c.t.waitall(sreqs)


def reduce_tree(c, send: int, acc: int, count: int, root: int) -> None:
    """Binomial tree reduction into ``acc`` at the root, pipelined per chunk.

    ``acc`` must already hold this rank's contribution (it may be ``send`` itself
    on a leaf, which only sends)."""
    n, r, isz = c.size, c.rank, c.itemsize
    vr = (r - root) % n
    parent, children = _tree(vr, n)
    parts = _chunks(count, c.chunk)
    tmps = [c.scratch(1 + i, count * isz) for i in range(len(children))]
    rreqs = [[_irecv(c, tmp + o * isz, k * isz, (ch + root) % n) for o, k in parts] for ch, tmp in zip(children, tmps)]
    sreqs = []
    for i, (o, k) in enumerate(parts):
        for reqs, tmp in zip(rreqs, tmps):
            c.t.wait(reqs[i])
            c.reduce(acc + o * isz, acc + o * isz, tmp + o * isz, k)
        if parent is not None:
            sreqs.append(_isend(c, acc + o * isz, k * isz, (parent + root) % n))
    c.t.waitall(sreqs)


# ------------------------------------------------------------- gather-like ops
def all_gather_ring(c, recv: int, block: int) -> None:
    """Ring: block i (bytes) ends at recv + i*block; this rank's block is in place."""
    n, r = c.size, c.rank
    right, left = (r + 1) % n, (r - 1) % n
    for s in range(n - 1):
        si, ri = (r - s) % n, (r - s - 1) % n
        c.t.waitall([_isend(c, recv + si * block, block, right), _irecv(c, recv + ri * block, block, left)])


def reduce_scatter_ring(c, send: int, recv: int, count: int, reverse: bool = False) -> None:
    """Ring: segment i of ``send`` (``count`` elements) is reduced over all ranks
    and ends on rank i.  ``send`` is never written (``recv`` may be segment r).
    Segment i's partial sum starts on rank i+1 and travels up the ring, or with ``reverse``
    (gloo's direction) starts on rank i-1 and travels down: ((x[i-1] + x[i-2]) + ...) + x[i]."""
    n, r, isz = c.size, c.rank, c.itemsize
    nbytes = count * isz
    step = -1 if reverse else 1
    right, left = (r + step) % n, (r - step) % n  # send to, receive from
    tmp = c.scratch(0, nbytes)
    accs = (c.scratch(1, nbytes), c.scratch(2, nbytes))
    outgoing = send + ((r - step) % n) * nbytes
    for s in range(n - 1):
        own = send + ((r - step * (s + 2)) % n) * nbytes
        dst = recv if s == n - 2 else accs[s % 2]
        sreqs = _isend_chunked(c, outgoing, count, right)
        _recv_reduce(c, dst, own, tmp, count, left)
        c.t.waitall(sreqs)
        outgoing = dst


def all_to_all_pairwise(c, send: int, recv: int, block: int) -> None:
    """n-1 rounds; in round s rank r sends to r+s and receives from r-s."""
    n, r = c.size, c.rank
    for s in range(1, n):
        dst, src = (r + s) % n, (r - s) % n
        c.t.waitall([_isend(c, send + dst * block, block, dst), _irecv(c, recv + src * block, block, src)])


def gather_linear(c, send: int, recv: int, block: int, root: int) -> None:
    n, r = c.size, c.rank
    if r != root:
        c.t.waitall([_isend(c, send, block, root)])
        return
    c.t.waitall([_irecv(c, recv + i * block, block, i) for i in range(n) if i != r])


def scatter_linear(c, send: int, recv: int, block: int, root: int) -> None:
    n, r = c.size, c.rank
    if r != root:
        c.t.waitall([_irecv(c, recv, block, root)])
        return
    c.t.waitall([_isend(c, send + i * block, block, i) for i in range(n) if i != r])
