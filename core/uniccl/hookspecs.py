"""Hook specifications every uniccl platform plugin implements (pluggy project "uniccl").

A plugin is a module (or object) registered under the entry-point group
``uniccl.plugins``; it defines some of the functions below decorated with
``uniccl.hookimpl`` (or its own ``pluggy.HookimplMarker("uniccl")``, which is the
same thing, so a plugin can be built without importing the core).

How the core uses the hooks
---------------------------
* Discovery calls ``uniccl_platform_info`` and ``uniccl_probe`` on each plugin once.
* When a communicator is made, the manager resolves the chosen plugin's hook
  implementations once into a ``Backend`` (plain function references).  The
  per-call hot path calls those functions directly; pluggy is never on it.
* Every hook is therefore called for ONE plugin at a time: implementations
  never need to check whether the call is "for them".

Conventions (the plugin ABI, version ``UNICCL_PLUGIN_API``)
------------------------------------------------------------
* Pointers are Python ints (addresses).  Streams and events are opaque objects
  created by the plugin itself; ``None`` as a stream means "synchronous: finished
  when the call returns".
* ``dtype`` is an int of :class:`uniccl._types.DType` (0-9 equal NCCL's
  ncclDataType_t, 10=int16, 11=uint16); ``op`` an int of
  :class:`uniccl._types.ReduceOp` (equal to ncclRedOp_t); ``kind`` an int of
  :class:`uniccl._types.MemcpyKind` (equal to cudaMemcpyKind).
* Errors: raise a subclass of :class:`uniccl.UnicclError` (vendor statuses go
  through the plugin's single ``check_status``), never return error codes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import pluggy

#: Version of this interface.  A plugin declares the versions it implements in
#: ``uniccl_platform_info()["api_version"]``: one int, or a ``[lowest, highest]`` pair.  The core
#: accepts any plugin whose range meets ``UNICCL_PLUGIN_API_OLDEST..UNICCL_PLUGIN_API``, uses the
#: highest version both know, and adapts an older one (``_plugins.ADAPTERS``), as NCCL keeps
#: adapters for its older plugin ABIs; ``uniccl info`` says why it rejects any other.
#:
#: History: 1 -- the first interface (with a ``uniccl_transports`` hook nothing called);
#: 2 -- ``uniccl_transports`` removed, ``api_version`` may be a range, ``uniccl_native_collectives``
#: returns a :class:`NativeCollectives`.
UNICCL_PLUGIN_API = 2
UNICCL_PLUGIN_API_OLDEST = 1

hookspec = pluggy.HookspecMarker("uniccl")
hookimpl = pluggy.HookimplMarker("uniccl")


# --------------------------------------------------------------------------- probe
@hookspec
def uniccl_platform_info() -> dict:
    """Describe the plugin without touching any SDK (must be cheap, never fail).

    Returns a dict with keys ``name`` (platform name, e.g. "cpu"), ``version``
    (plugin version string), ``api_version`` (the ``UNICCL_PLUGIN_API`` versions it implements:
    an int or a ``[lowest, highest]`` pair),
    ``priority`` (int; higher wins the automatic choice, cpu is 0) and
    ``description``.
    """


@hookspec
def uniccl_probe() -> dict:
    """Is this platform usable in this process?

    Returns a dict: ``available`` (bool), ``reason`` (why not, or "" when
    available), ``devices`` (list of dicts with ``index``, ``name``,
    ``total_memory`` bytes), ``versions`` (dict: SDK/driver/library -> version
    string) and ``kernels`` (str: which reduction kernels are built, e.g.
    "native C (avx2)" or "none: nvcc not found at build time").
    May load vendor libraries (dlopen); must not raise for a missing SDK.
    """


# --------------------------------------------------------------- device memory
@hookspec
def uniccl_mem_alloc(device: int, nbytes: int) -> int:
    """Allocate ``nbytes`` of device memory on ``device``; return its address."""


@hookspec
def uniccl_mem_free(device: int, ptr: int) -> None:
    """Free memory from ``uniccl_mem_alloc``."""


@hookspec
def uniccl_host_alloc(nbytes: int) -> int:
    """Allocate pinned (page-locked, page-aligned) host memory; return its address."""


@hookspec
def uniccl_host_free(ptr: int) -> None:
    """Free memory from ``uniccl_host_alloc``."""


@hookspec
def uniccl_memcpy(dst: int, src: int, nbytes: int, kind: int, stream) -> None:
    """Copy ``nbytes`` from ``src`` to ``dst`` in direction ``kind``.

    With ``stream`` None the copy is complete on return; otherwise it is ordered
    on ``stream`` after everything already enqueued there.
    """


# ----------------------------------------------------------- streams and events
@hookspec
def uniccl_stream_create(device: int):
    """Create an in-order stream on ``device``; return an opaque handle."""


@hookspec
def uniccl_stream_destroy(stream) -> None:
    """Destroy ``stream`` after its pending work has completed."""


@hookspec
def uniccl_stream_synchronize(stream) -> None:
    """Block until all work enqueued on ``stream`` has completed."""


@hookspec
def uniccl_stream_wait_event(stream, event) -> None:
    """Make future work on ``stream`` wait until ``event`` has completed."""


@hookspec
def uniccl_event_create(device: int):
    """Create an event; return an opaque handle."""


@hookspec
def uniccl_event_destroy(event) -> None:
    """Destroy ``event``."""


@hookspec
def uniccl_event_record(event, stream) -> None:
    """Record ``event`` on ``stream``: it completes when prior work there has."""


@hookspec
def uniccl_event_query(event) -> bool:
    """True when ``event`` has completed (or was never recorded)."""


@hookspec
def uniccl_event_synchronize(event) -> None:
    """Block until ``event`` has completed."""


# --------------------------------------------------------------------- kernels
@hookspec
def uniccl_reduce(dst: int, a: int, b: int, count: int, dtype: int, op: int, stream) -> None:
    """Elementwise ``dst[i] = op(a[i], b[i])`` for ``count`` elements.

    ``dst`` may equal ``a`` or ``b``.  ``op`` is SUM, PROD, MAX or MIN (AVG is
    SUM followed by ``uniccl_scale``).  Integers wrap on overflow; float16 and
    bfloat16 are computed in float32 and rounded once per call.
    """


@hookspec
def uniccl_scale(dst: int, src: int, count: int, dtype: int, divisor: int, stream) -> None:
    """``dst[i] = src[i] / divisor`` (AVG's final step).

    Floating types divide in (at least) float32; integer types truncate toward
    zero, as NCCL's ncclAvg does.
    """


@hookspec
def uniccl_host_reduce_kernel():
    """Address (int) of a C function that reduces *host* memory, or None.

    Signature ``int fn(void *dst, const void *a, const void *b, size_t count,
    int dtype, int op)`` with the semantics of ``uniccl_reduce``; returns 0 on
    success.  It must be callable without the GIL from any thread: native
    transports (the shared-memory engine) call it on chunks as they arrive.
    """


# ---------------------------------------------------------------- buffer claim
@hookspec
def uniccl_dlpack_device_types() -> list:
    """DLPack device type codes this platform may own (e.g. [1] for cpu, [2] for cuda)."""


@hookspec
def uniccl_claim_pointer(ptr: int, device_type: int, device_id: int):
    """Does ``ptr`` (reported with DLPack ``device_type``/``device_id``) belong to this
    platform?  Return the device index it lives on, or None when it is not ours.

    DLPack codes cannot tell CoreX from CUDA nor name MetaX, Moore or Cambricon
    at all, so a device plugin should confirm with its runtime's pointer query.
    """


# -------------------------------------------------------------- collectives
@hookspec
def uniccl_native_collectives():
    """Optional whole-collective implementation by a vendor library (NCCL-class).

    Return None when there is none, else an object implementing :class:`NativeCollectives`
    (``uniccl.kit``'s ``DevicePlugin`` returns one over any NCCL-class library).
    """


class NativeCollectives(Protocol):
    """What ``uniccl_native_collectives()`` returns: whole collectives through the vendor's
    library, on communicators of its own (one per uniccl communicator)."""

    name: str  # the library, as the flight recorder and ``uniccl info`` show it ("nccl", "cncl")

    def supports(self, dtype: int, op: int = 0) -> bool:
        """Can the library run this dtype (and reduction op)?  Otherwise the core moves the data."""
        ...

    def create(self, size: int, rank: int, device: int, bcast_obj: Callable[..., Any]) -> int:
        """Make the library's communicator, collectively: rank 0 makes the id and
        ``bcast_obj(obj)`` shares it (returns rank 0's object on every rank).  A handle (int)."""
        ...

    def destroy(self, comm: int) -> None:
        """Free a communicator after every call on it finished."""
        ...

    def abort(self, comm: int) -> None:
        """End a communicator at once, calls in flight included (``Communicator.abort``)."""
        ...

    def run(self, coll: str, comm: int, args: dict, stream: Any, rank: int) -> None:
        """Enqueue collective ``coll`` (``all_reduce``, ``broadcast``, ``reduce``, ``all_gather``,
        ``reduce_scatter``) with ``args`` (device pointers, count, dtype, op, root) on ``stream``
        (a stream of this plugin's, or None: the default stream)."""
        ...

    def c_entry(self, coll: str, dtype: int, op: int) -> tuple[int, int, int, Callable[[int, int], None]] | None:
        """Optional, for the compiled call path: ``(address, vendor dtype, vendor op, check)``
        -- the address of the library's C function for ``coll`` when it takes NCCL's arguments
        (``ncclAllReduce(send, recv, count, datatype, op, comm, stream)``, ``ncclBroadcast``
        with the root for the op, ``ncclReduce`` with both, ``ncclAllGather`` with neither,
        ``ncclReduceScatter``), the codes to pass it, and ``check(status, rank)`` raising a
        failed status's typed error -- or None: such calls go through :meth:`run`.  A library
        without the method is called through :meth:`run` always."""
        ...

    def group_start(self) -> None:
        """Start fusing the calls that follow into one launch (``uniccl.group()``)."""
        ...

    def group_end(self) -> None:
        """Launch the calls since ``group_start``."""
        ...
