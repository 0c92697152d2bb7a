"""The reader threads of the TCP mesh: at most ``READERS`` per process, however many peers it is
connected to.  Each is an epoll loop (:class:`_Poller`) over the connections of the peers given
to it (a new peer goes to the next loop in turn, so the first ``READERS`` peers each have one of
their own and read in parallel).

What a connection's reader does is written as a generator (``Mesh._steps``): it reads and
handles messages until its socket has nothing more (``recv`` with ``MSG_DONTWAIT``), then
yields; the loop resumes it when the socket is readable again.  A generator keeps its place in
a half-read message, so a peer stopped in the middle of one holds nothing but its own stream.
A generator may also yield a monotonic time: it is resumed then, its socket left unread
meanwhile (a message held by fault injection's ``delay``).  A connection that fails (reset,
closed, an error in the reader) leaves its loop; the mesh then heals it or reports the peer
lost (:meth:`heal._Healer._stream_broke`).
"""

from __future__ import annotations

import heapq
import itertools
import os
import select
import threading
import time

from ... import _threads
from ...observability.log import logger

READERS = 4  # reader threads per process at most (a loop serves many peers)
_INBOX = 32 * 1024  # bytes read at once from a plain socket (small messages: header and payload in one read)
_STOP_S = 2.0  # after the mesh closed, the most a loop waits for its connections to end


class _Stream:
    """One connection being read: its peer, the stream (a _Buffered socket, or a _TLS), its
    generation (heal.py), the file descriptor watched and the reader's generator."""

    __slots__ = ("peer", "stream", "gen", "fd", "steps")

    def __init__(self, peer: int, stream, gen: int, steps):
        self.peer, self.stream, self.gen, self.steps = peer, stream, gen, steps
        self.fd = stream.sock.fileno()  # (the raw socket under the _Buffered or _TLS)


class _Buffered:
    """A plain socket read through a buffer: one ``recv`` takes whatever has come (a small
    message's header and payload, and the next messages), the reads take from it; a read of
    half the buffer or more, with nothing buffered, goes straight into the caller's memory."""

    __slots__ = ("sock", "_mv", "_at", "_end")

    def __init__(self, sock):
        self.sock = sock
        self._mv = memoryview(bytearray(_INBOX))
        self._at = self._end = 0

    def buffered(self) -> bool:
        return self._at < self._end

    def recv_into(self, view, nbytes: int = 0, flags: int = 0) -> int:
        """As a socket's (``nbytes`` ignored)."""
        at, end = self._at, self._end
        if at == end:
            if len(view) >= _INBOX // 2:
                return self.sock.recv_into(view, 0, flags)
            end = self.sock.recv_into(self._mv, 0, flags)
            if not end:
                return 0
            at, self._end = 0, end
        n = min(end - at, len(view))
        view[:n] = self._mv[at : at + n]
        self._at = at + n
        return n


class _Poller:
    """One reader thread: an epoll loop over some peers' connections (see the module)."""

    def __init__(self, mesh, index: int):
        self.mesh = mesh
        self._ep = select.epoll()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._ep.register(self._wake_r, select.EPOLLIN)
        self._jobs: dict[int, _Stream] = {}  # fd -> the connection read there
        self._lock = threading.Lock()
        self._adds: list[_Stream] = []  # handed over by other threads, registered by the loop
        self._naps: list = []  # heap of (resume at, n, _Stream): held messages
        self._order = itertools.count()
        self._stop = False
        self.thread = _threads.start(self._run, name=f"uniccl-tcp-r{mesh.rank}-poll{index}")

    def add(self, peer: int, stream, gen: int) -> None:
        """Read ``stream``, the connection of generation ``gen`` to ``peer``, from now on."""
        if not hasattr(stream, "buffered"):  # a plain socket (a _TLS buffers already)
            stream = _Buffered(stream)
        job = _Stream(peer, stream, gen, self.mesh._steps(peer, stream))
        with self._lock:
            self._adds.append(job)
        self._wake()

    def stop(self) -> None:
        """The mesh closed: end once its connections have ended (at most _STOP_S)."""
        self._stop = True
        self._wake()

    def _wake(self) -> None:
        try:
            os.write(self._wake_w, b"x")
        except OSError:  # full (a wake is pending anyway), or closed
            pass

    def _run(self) -> None:
        ep, jobs, naps = self._ep, self._jobs, self._naps
        stop_by = None
        try:
            while True:
                wait = -1.0 if not naps else max(0.0, naps[0][0] - time.monotonic())
                if stop_by is not None:
                    wait = 0.1 if wait < 0 else min(0.1, wait)
                for fd, _ in ep.poll(wait):
                    job = jobs.get(fd)
                    if job is not None:
                        self._step(job)
                    elif fd == self._wake_r:
                        self._take_adds()
                while naps and naps[0][0] <= time.monotonic():  # held messages: go on reading
                    job = heapq.heappop(naps)[2]
                    self._watch(job)
                    self._step(job)
                if self._stop:
                    stop_by = stop_by or time.monotonic() + _STOP_S
                    for job in [j for j in jobs.values() if j.stream.sock.fileno() < 0]:  # (epoll forgets a closed fd)
                        self._drop(job)
                        self.mesh._stream_broke(job.peer, job.gen, OSError("the connection was closed"))
                    if not jobs and not naps or time.monotonic() > stop_by:
                        return
        finally:
            ep.close()
            os.close(self._wake_r)
            os.close(self._wake_w)

    def _watch(self, job: _Stream) -> None:
        self._jobs[job.fd] = job
        self._ep.register(job.fd, select.EPOLLIN)

    def _unwatch(self, job: _Stream) -> None:
        if self._jobs.get(job.fd) is job:
            del self._jobs[job.fd]
            try:
                self._ep.unregister(job.fd)
            except OSError:  # closed meanwhile (the kernel dropped it)
                pass

    def _take_adds(self) -> None:
        try:
            while os.read(self._wake_r, 4096):
                pass
        except BlockingIOError:
            pass
        with self._lock:
            adds, self._adds = self._adds, []
        for job in adds:
            self._watch(job)
            self._step(job)

    def _step(self, job: _Stream) -> None:
        """Let ``job``'s reader go on until it waits for its socket (or holds a message)."""
        try:
            until = job.steps.send(None)
        except (OSError, ConnectionError, StopIteration) as exc:
            self._drop(job)
            self.mesh._stream_broke(job.peer, job.gen, exc if not isinstance(exc, StopIteration) else None)
            return
        except Exception as exc:  # a bug: say so; the peer's link is dealt with as a broken one
            logger.exception("rank %d: reading from rank %d", self.mesh.rank, job.peer)
            self._drop(job)
            self.mesh._stream_broke(job.peer, job.gen, exc)
            return
        if until is not None:  # hold the rest of the stream until then
            self._unwatch(job)
            heapq.heappush(self._naps, (until, next(self._order), job))

    def _drop(self, job: _Stream) -> None:
        self._unwatch(job)
        job.steps.close()
