"""TCP as a transport: ranks connect without MPI, on one host or across hosts.

The *mesh* is one authenticated socket per pair of ranks that talk, made at the pair's
first use (the first send to a peer, or the first receive posted from it: :mod:`.heal`):
every rank listens and publishes its address through a rendezvous
(:mod:`uniccl.bootstrap.rendezvous`); the higher rank of a pair dials the lower one (which,
needing the link first, pokes it).  A rank thus holds links only to the peers its algorithms
and the tree-shaped control exchanges use (about 2 log2 n).  At most four reader
threads, each an epoll loop over some peers' sockets (:mod:`.poller`), always drain
them (they never block: what they must send -- requests for a copy, the copies,
answers to probes -- goes to that peer's sender thread), so a sender always makes progress while the peer runs, and ``isend`` can
simply send in the caller's thread.  A send waits for a peer that takes no data
(stopped, hung) at most the call's timeout, then raises Timeout naming it; what a
timed-out send left unsent is kept and goes out first when the peer takes data
again, so the stream to it is never left with half a message.

``UNICCL_TCP_TLS=1``: every connection is TLS 1.3 (Python's ``ssl`` over memory BIOs)
between ephemeral self-signed certificates, each rank's published through the
rendezvous and pinned by its SHA-256 on the other side, and bound to the job secret
by an HMAC over both fingerprints (see :class:`_TLSIdentity`).

Messages carry (context, tag, length); a receive matches the oldest message of
its (peer, context, tag), as MPI matches (source, tag, communicator).  Every
communicator (the world, each ``split``) is a :class:`TCPTransport` with its own
contexts over the same mesh.  A peer whose connection drops fails every pending
and later receive from it at once, naming the rank and host: a dead rank never
leaves the others hanging.

Integrity (on by default; ``UNICCL_TCP_CHECKSUM=0`` turns it off): every message
carries the CRC-32C of its payload, verified on receipt.  The sender keeps a copy of
what it sent (``UNICCL_TCP_RETAIN_BYTES``, default 64 MiB, one ring shared by the peers, oldest dropped
first); a receiver that finds a mismatch asks for that message again and holds what the
peer sent after it until the copy arrives, so order is kept.  Counters:
``Mesh.stats``; after 3 failed copies of one message the communicator fails with a
typed error.  At exit a rank waits (at most 3 s) until its peers have checked all it sent,
so that a copy asked for late is still sent.  Fault injection for tests: :mod:`uniccl.reliability.faults`.

The modules, each importing only those above it in this list:

- :mod:`.wire`: the message header, its flags and reserved tags, the channels, the socket
  primitives (``_head``, ``_view``, ``_recv_into``, ``_push``), ``derive_context``;
- :mod:`.base`: the receive requests (``_Recv``), what a rank knows of its peers'
  processes, and ``_MeshBase``: the state and methods the Mesh's parts share;
- :mod:`.integrity`: checksums, the copies kept for retransmission, corrupted messages;
- :mod:`.tls`: ``_TLS`` and ``_TLSIdentity``;
- :mod:`.sender`: the sending side of each connection, its sender thread;
- :mod:`.control`: control messages (the agreement of calls, probes, the sync at exit, aborts);
- :mod:`.poller`: the reader threads, epoll loops running each connection's reader (a generator);
- :mod:`.heal`: the links, made at first use and dialled again when they break;
- :mod:`.mesh`: :class:`Mesh`, the connections, the reading of messages and matching, made of those parts;
- :mod:`.transport`: :class:`TCPTransport`, one communicator over the mesh.
"""

from ..net import host_key, route_address
from .integrity import _checksums as _checksums
from .mesh import Mesh
from .tls import _TLS as _TLS
from .tls import _TLSIdentity as _TLSIdentity
from .transport import TCPTransport
from .wire import CTRL, DATA, P2P, derive_context

__all__ = ["CTRL", "DATA", "P2P", "Mesh", "TCPTransport", "derive_context", "host_key", "route_address"]
