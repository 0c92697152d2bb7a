"""What goes on the wire of the TCP mesh: the message header, its flags, the reserved tags,
the channels of a communicator's contexts, and the socket primitives that move bytes.

Every message starts with ``_HEAD`` bytes: the header ``_HDR`` (context, tag, payload bytes,
CRC-32C, flags, message id) and a ``_STAMP`` area (a call's 64-byte record and a 64-bit mask of
ranks, valid under ``_STAMPED``), then the payload.  Pure constants and functions: nothing here
holds state.
"""

from __future__ import annotations

import ctypes
import hashlib
import socket
import struct
import time

from ..record import RECORD_BYTES

_HDR = struct.Struct("<QIQIIQ")  # context, tag, payload bytes, CRC-32C, flags, message id (per sender and peer)
_CHECKED, _RETRANSMIT, _GONE = 1, 2, 4  # flags: the CRC is valid; a message sent again; asked for but no longer held
_NACK = struct.Struct("<Q")  # the payload of a request to send message id again
_INLINE = 64 * 1024  # payloads up to this size go out in one send with their header
_TIMED_BYTES = 32 * 1024  # telemetry times messages from this size on (their clock reads cost < 1 %)
DATA, P2P, CTRL = 0, 1, 2  # channels of one communicator, like MPITransport's three dup'ed comms
_CTRL_TAG_BASE = 1 << 30
_ABORT_TAG = 0xFFFFFFFF  # "this communicator was aborted by its sender": fail its receives from that peer
_NACK_TAG = 0xFFFFFFFE  # "message <id> reached me corrupted: send it again"
_FLUSH_TAG = 0xFFFFFFFD  # "nothing more of the call that failed its agreement follows from me"
_PROBE_TAG = 0xFFFFFFFC  # "have you begun call <seq> of this communicator?" (asked after a timeout)
_PROBED_TAG = 0xFFFFFFFB  # the answer: the last call begun there
_SYNC_TAG = 0xFFFFFFFA  # "answer once all I sent you before this is checked" (asked at exit: see Mesh.linger)
_SYNCED_TAG = 0xFFFFFFF9  # the answer
_TABLE_TAG = 0xFFFFFFF8  # the job's table (every rank's address, ...), down the tree at init (Mesh._spread_table)
_ASKED = frozenset((_PROBE_TAG, _PROBED_TAG, _SYNC_TAG, _SYNCED_TAG))  # the reader answers or delivers them
_Q = struct.Struct("<q")
_MASK = struct.Struct("<Q")  # a stamp's ranks (bit r: rank r's record matched)
_STAMPED = 8  # flag: the stamp area holds a stamp (the call's record, the ranks matched so far)
_STAMP = RECORD_BYTES + 8  # bytes: the call's record and a 64-bit mask of ranks
_NO_STAMP = bytes(_STAMP)
_HEAD = _HDR.size + _STAMP  # every message starts so: one read gets the header and the stamp
_REC_BASE, _SLOW_BASE = 1 << 28, 1 << 29  # control-context tags of a call's records: base + data tag
_T = struct.Struct("<I")  # a flush marker's payload: the data tag of the call it ends
_SLICE_US = 100_000  # a blocked send returns from the kernel after this long (SO_SNDTIMEO) to look at its deadline
_TLS_SLICE = 256 * 1024  # plaintext bytes encrypted at a time (then sent) over TLS
_DONTWAIT = socket.MSG_DONTWAIT  # a read that returns at once: the reader threads serve many sockets


def _head(ctx: int, tag: int, n: int, crc: int, flags: int, msg_id: int, stamp=None) -> bytes:
    return _HDR.pack(ctx, tag, n, crc, flags, msg_id) + (stamp or _NO_STAMP)


def _view(ptr: int, nbytes: int) -> memoryview:
    return memoryview((ctypes.c_char * nbytes).from_address(ptr)).cast("B")


def _recv_into(sock, view: memoryview) -> None:
    while view.nbytes:
        got = sock.recv_into(view)
        if not got:
            raise ConnectionError("connection closed")
        view = view[got:]


def _take(sock, view: memoryview):
    """(generator) Fill ``view`` from ``sock`` (a socket, or a _TLS) without blocking: yields
    whenever the socket has nothing to read yet (a reader loop resumes it: poller.py)."""
    while view.nbytes:
        try:
            got = sock.recv_into(view, 0, _DONTWAIT)
        except BlockingIOError:
            got = -1
        if got < 0:
            yield
        elif got:
            view = view[got:]
        else:
            raise ConnectionError("connection closed")


def _push(sock, view, sent: int, deadline, flags: int = 0) -> int:
    """Send ``view`` from byte ``sent`` on until all of it is out, or ``deadline`` (monotonic;
    None: none) has passed, or (``flags`` MSG_DONTWAIT) the socket is full: the bytes sent.
    The socket's SO_SNDTIMEO returns a blocked send every _SLICE_US to look at the clock."""
    view = memoryview(view)
    n = len(view)
    while sent < n:
        try:
            sent += sock.send(view[sent:], flags)
            if sent >= n:
                break
        except BlockingIOError:  # nothing could be sent within the slice
            if flags:
                break
        if deadline is not None and time.monotonic() >= deadline:
            break
    return sent


def derive_context(parent: int, n: int, color: int) -> int:
    """Context id of a new communicator, the same on each of its members however many
    other communicators each of them made (a hash of its lineage, 2 low bits free)."""
    digest = hashlib.sha256(f"{parent}/{n}/{color}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ~3
