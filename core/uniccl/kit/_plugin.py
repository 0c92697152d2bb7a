"""Every uniccl hook of an accelerator platform, from its specs.

A vendor plugin is an instance: ``plugin = DevicePlugin("nvidia", runtime_spec,
ccl_spec, ...)`` registered by its entry point.  The specs bind their libraries
(``spec.load()``): CUDA-like runtimes and NCCL-class libraries through the kit's
templates, others (Cambricon's CNRT and CNCL) through bindings of the same shape
in their own plugin.  Nothing is loaded until the
probe; a missing library or driver makes the platform "unavailable" with the
exact reason, never an import error.
"""

from __future__ import annotations

import ctypes
import os
import threading

import pluggy

from .. import _env, hookspecs
from .._errors import InvalidArgument, InvalidUsage, PlatformUnavailable
from ._ccl import SIGNATURES
from ._dl import ccl_conflict, find_library, note_ccl

hookimpl = pluggy.HookimplMarker("uniccl")


class _NoKernels:
    info = "none"

    def reduce(self, *a):
        raise InvalidUsage("this plugin was built without device reduction kernels", op="reduce")

    scale = reduce


class _Kernels:
    """The vendor's reduction kernels (a C ABI: <prefix>_reduce, <prefix>_scale,
    <prefix>_kernels_info; the shared CUDA-dialect ones are ``uniccl_cuda``)."""

    def __init__(self, path: str, prefix: str = "uniccl_cuda"):
        lib = ctypes.CDLL(path)
        self._reduce, self._scale = getattr(lib, prefix + "_reduce"), getattr(lib, prefix + "_scale")
        self._reduce.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_void_p]
        self._scale.argtypes = [
            ctypes.c_void_p,
            ctypes.c_void_p,
            ctypes.c_size_t,
            ctypes.c_int,
            ctypes.c_ulonglong,
            ctypes.c_void_p,
        ]
        self._reduce.restype = self._scale.restype = ctypes.c_int
        info = getattr(lib, prefix + "_kernels_info", None)
        if info is not None:
            info.restype = ctypes.c_char_p
        text = info().decode() if info is not None else "built"
        # the host-compile build (tests) runs a launch at once on the calling thread: the
        # plugin waits for the stream's earlier work first, as a device would
        self.on_host = text.startswith("host emulation")
        self.info = f"{text} ({os.path.basename(path)})"

    def reduce(self, dst, a, b, count, dtype, op, stream) -> int:
        return self._reduce(dst, a, b, count, dtype, op, stream)

    def scale(self, dst, src, count, dtype, divisor, stream) -> int:
        return self._scale(dst, src, count, dtype, divisor, stream)


# the collectives the compiled path calls by address (comm/_fastpath), when they are bound
# with NCCL's argument types (kit._ccl.SIGNATURES)
_C_NAMES = {
    "all_reduce": "AllReduce",
    "broadcast": "Broadcast",
    "reduce": "Reduce",
    "all_gather": "AllGather",
    "reduce_scatter": "ReduceScatter",
}


class NativeNccl:
    """Whole collectives through the vendor's NCCL-class library (``hookspecs.NativeCollectives``)."""

    def __init__(self, plugin: DevicePlugin, ccl):  # a CclLibrary, or a binding of its shape (CNCL)
        self.plugin, self.ccl, self.name = plugin, ccl, ccl.spec.prefix

    def supports(self, dtype: int, op: int = 0) -> bool:
        return self.ccl.dtype(dtype) is not None and op in self.ccl.spec.ops

    def create(self, size: int, rank: int, device: int, bcast_obj) -> int:
        """Collective over the communicator: rank 0 makes the id, ``bcast_obj`` shares it."""
        uid = self.ccl.unique_id() if rank == 0 else None
        uid = bcast_obj(uid, 0)
        self.plugin.runtime().set_device(device, op="init")
        return self.ccl.comm_init(size, uid, rank, device)

    def destroy(self, comm: int) -> None:
        self.ccl.destroy(comm)

    def abort(self, comm: int) -> None:
        self.ccl.abort(comm)

    def run(self, coll: str, comm: int, args: dict, stream, rank: int) -> None:
        """Enqueue one collective on ``stream`` (a plugin stream handle or None: default stream)."""
        V = ctypes.c_void_p
        c, s, dt = V(comm), V(stream or 0), self.ccl.dtype(args["dtype"])
        op = self.ccl.spec.ops.get(args.get("op", 0))
        send, recv, count = V(args.get("send")), V(args.get("recv")), args.get("count", 0)
        table = {
            "all_reduce": ("AllReduce", (send, recv, count, dt, op, c, s)),
            "broadcast": ("Broadcast", (send, recv, count, dt, args.get("root", 0), c, s)),
            "reduce": ("Reduce", (send, recv, count, dt, op, args.get("root", 0), c, s)),
            "all_gather": ("AllGather", (send, recv, count, dt, c, s)),
            "reduce_scatter": ("ReduceScatter", (send, recv, count, dt, op, c, s)),
            "send": ("Send", (send, count, dt, args.get("peer", 0), c, s)),
            "recv": ("Recv", (recv, count, dt, args.get("peer", 0), c, s)),
        }
        name, call_args = table[coll]
        self.ccl.call(name, *call_args, op=coll, rank=rank)

    def c_entry(self, coll: str, dtype: int, op: int):
        """The compiled call path's way in (``hookspecs.NativeCollectives.c_entry``): the
        address of the library's function for ``coll`` when it is bound with NCCL's argument
        types, the vendor's codes for ``dtype`` and ``op``, and the status check; or None."""
        name = _C_NAMES.get(coll, "")
        fn = self.ccl._fns.get(name) if name else None
        if fn is None or list(fn.argtypes) != SIGNATURES[name] or not hasattr(self.ccl, "check"):
            return None  # another shape of call, or no status check to name a failure: run() takes it
        dt, vop = self.ccl.dtype(dtype), self.ccl.spec.ops.get(op, 0)
        if dt is None or vop is None:
            return None

        def check(status: int, rank: int) -> None:
            self.ccl.check(status, name, op=coll, rank=rank)

        return ctypes.cast(fn, ctypes.c_void_p).value, dt, vop, check

    def group_start(self) -> None:
        self.ccl.call("GroupStart")

    def group_end(self) -> None:
        self.ccl.call("GroupEnd")


class DevicePlugin:
    """uniccl hooks for one accelerator vendor.

    ``dlpack_types``: DLPack device codes its buffers may carry (CUDA 2 and 3 for
    NVIDIA; CoreX also presents as 2: pointers are confirmed with the runtime).
    ``kernels_env``: variable naming a kernel library to use instead of the built one;
    ``kernels_prefix``: its C ABI's symbol prefix.
    ``detect``: optional callable returning "" when the hardware seems present, else why not.
    """

    def __init__(
        self,
        name: str,
        version: str,
        runtime,
        ccl,
        *,
        priority: int,
        dlpack_types=(2, 3),
        kernels_dir: str | None = None,
        kernels_env: str | None = None,
        kernels_prefix: str = "uniccl_cuda",
        detect=None,
        description: str = "",
    ):
        self.name, self.version, self.priority = name, version, priority
        self.runtime_spec, self.ccl_spec = runtime, ccl
        self.dlpack_types = list(dlpack_types)
        self.kernels_dir, self.kernels_env, self.kernels_prefix = kernels_dir, kernels_env, kernels_prefix
        self.detect, self.description = detect, description or f"{runtime.vendor} through {runtime.prefix}* (dlopen)"
        self._lock = threading.Lock()
        self._rt = None
        self._rt_reason = None
        self._ccl = None
        self._ccl_reason = None
        self._kernels = None

    # ---------------------------------------------------------- lazy loading
    def runtime(self):
        """The bound runtime; a failed search is not remembered (the environment may change)."""
        with self._lock:
            if self._rt is None:
                self._rt, self._rt_reason = self.runtime_spec.load()
        if self._rt is None:
            raise PlatformUnavailable(f"{self.name}: {self._rt_reason}")
        return self._rt

    def ccl(self):
        if self.ccl_spec is None:
            return None, "no collective library for this platform"
        spec = self.ccl_spec
        with self._lock:
            if self._ccl is None:
                clash = ccl_conflict(spec.prefix, self.name, spec.exclusive)
                if clash:
                    return None, clash  # e.g. Moore's libmccl where MetaX's is loaded: never both
                self._ccl, self._ccl_reason = spec.load()
                if self._ccl is not None:
                    note_ccl(spec.prefix, self.name, self._ccl.path)
        return self._ccl, self._ccl_reason or ""

    def kernels(self):
        if self._kernels is None:
            var = self.kernels_env or ""  # uniccl's plugins' are in _env's table; another plugin's may not be
            path = (_env.path(var) if var in _env.VARS else os.environ.get(var, "").strip()) or ""
            if not path and self.kernels_dir:
                found = (
                    [f for f in sorted(os.listdir(self.kernels_dir)) if f.endswith(".so")]
                    if os.path.isdir(self.kernels_dir)
                    else []
                )
                path = os.path.join(self.kernels_dir, found[0]) if found else ""
            try:
                self._kernels = _Kernels(path, self.kernels_prefix) if path else _NoKernels()
            except (OSError, AttributeError) as exc:
                k = _NoKernels()
                k.info = f"none: {path} unusable: {exc}"
                self._kernels = k
            if isinstance(self._kernels, _NoKernels) and self._kernels.info == "none":
                note = os.path.join(self.kernels_dir or "", "BUILD_INFO")
                why = open(note).read().strip() if os.path.exists(note) else "not built"
                self._kernels.info = why if why.startswith("none") else f"none: {why}"
        return self._kernels

    # ------------------------------------------------------------------ probe
    @hookimpl
    def uniccl_platform_info(self) -> dict:
        return {
            "name": self.name,
            "version": self.version,
            "api_version": hookspecs.UNICCL_PLUGIN_API,  # kit ships with the core: always its version
            "priority": self.priority,
            "description": self.description,
        }

    @hookimpl
    def uniccl_probe(self) -> dict:
        out = {"available": False, "reason": "", "devices": [], "versions": {}, "kernels": self.kernels().info}
        try:
            rt = self.runtime()
        except PlatformUnavailable:
            out["reason"] = self._rt_reason
            return out
        out["versions"]["runtime"] = f"{rt.version('RuntimeGetVersion')} ({rt.path})"
        drv = rt.version("DriverGetVersion")
        if drv:
            out["versions"]["driver"] = str(drv)
        out["versions"][self.ccl_spec.prefix if self.ccl_spec else "ccl"] = self._ccl_version()
        n, status = rt.device_count()
        if n == 0:
            name = rt.name_of(status) or rt.spec.statuses.get(status, str(status))
            out["reason"] = (
                f"no {self.runtime_spec.vendor} device: {rt.spec.prefix}GetDeviceCount returned {name} ({status})"
                if status
                else f"{rt.spec.prefix}GetDeviceCount found 0 devices"
            )
            return out
        hint = self.detect() if self.detect else ""
        out["devices"] = [rt.device_info(d) for d in range(n)]
        out["available"], out["detect"] = True, hint
        return out

    def _ccl_version(self) -> str:
        spec = self.ccl_spec
        if spec is not None and spec.exclusive and self._ccl is None:
            clash = ccl_conflict(spec.prefix, self.name, spec.exclusive)
            if clash:
                return f"unavailable: {clash}"
            # only find it: loading is for the platform a communicator chooses, or a plugin that
            # merely probes would keep the other vendor's same-named library out of the process
            path, tried = find_library(spec.search)
            return (
                f"{path} (opened when a communicator uses it)"
                if path
                else f"unavailable: {spec.search.names[0]} not found (searched: {', '.join(tried)})"
            )
        ccl, why = self.ccl()
        return f"{ccl.version()} ({ccl.path})" if ccl is not None else f"unavailable: {why}"

    # ----------------------------------------------------------------- memory
    @hookimpl
    def uniccl_mem_alloc(self, device: int, nbytes: int) -> int:
        rt = self.runtime()
        rt.set_device(device, op="mem_alloc")
        return rt.malloc(nbytes, op="mem_alloc")

    @hookimpl
    def uniccl_mem_free(self, device: int, ptr: int) -> None:
        self.runtime().free(ptr, op="mem_free")

    @hookimpl
    def uniccl_host_alloc(self, nbytes: int) -> int:
        return self.runtime().malloc_host(nbytes, op="host_alloc")

    @hookimpl
    def uniccl_host_free(self, ptr: int) -> None:
        self.runtime().free_host(ptr, op="host_free")

    @hookimpl
    def uniccl_memcpy(self, dst: int, src: int, nbytes: int, kind: int, stream) -> None:
        if not 0 <= kind <= 4:
            raise InvalidArgument(f"memcpy kind must be 0-4, got {kind}", op="memcpy", argument="kind")
        if nbytes:
            self.runtime().memcpy(dst, src, nbytes, kind, stream, op="memcpy")

    # ------------------------------------------------------- streams, events
    @hookimpl
    def uniccl_stream_create(self, device: int):
        rt = self.runtime()
        rt.set_device(device, op="stream_create")
        return rt.stream_create()

    @hookimpl
    def uniccl_stream_destroy(self, stream) -> None:
        self.runtime().stream_destroy(stream)

    @hookimpl
    def uniccl_stream_synchronize(self, stream) -> None:
        self.runtime().stream_synchronize(stream, op="stream_synchronize")

    @hookimpl
    def uniccl_stream_wait_event(self, stream, event) -> None:
        rt = self.runtime()
        if not rt.stream_wait_event(stream, event):
            rt.event_synchronize(event)  # no device-side wait on this runtime: wait here instead

    @hookimpl
    def uniccl_event_create(self, device: int):
        rt = self.runtime()
        rt.set_device(device, op="event_create")
        return rt.event_create()

    @hookimpl
    def uniccl_event_destroy(self, event) -> None:
        self.runtime().event_destroy(event)

    @hookimpl
    def uniccl_event_record(self, event, stream) -> None:
        self.runtime().event_record(event, stream)

    @hookimpl
    def uniccl_event_query(self, event) -> bool:
        return self.runtime().event_query(event)

    @hookimpl
    def uniccl_event_synchronize(self, event) -> None:
        self.runtime().event_synchronize(event)

    # --------------------------------------------------------------- kernels
    @hookimpl
    def uniccl_reduce(self, dst: int, a: int, b: int, count: int, dtype: int, op: int, stream) -> None:
        k = self.kernels()
        self._host_kernel_order(k, stream)
        status = k.reduce(dst, a, b, count, dtype, op, stream or 0)
        self._kernel_status(status, self.kernels_prefix + "_reduce", stream)

    @hookimpl
    def uniccl_scale(self, dst: int, src: int, count: int, dtype: int, divisor: int, stream) -> None:
        k = self.kernels()
        self._host_kernel_order(k, stream)
        status = k.scale(dst, src, count, dtype, divisor, stream or 0)
        self._kernel_status(status, self.kernels_prefix + "_scale", stream)

    def _host_kernel_order(self, kernels, stream) -> None:
        if getattr(kernels, "on_host", False):
            self.runtime().stream_synchronize(stream, op="reduce")

    def _kernel_status(self, status: int, call: str, stream) -> None:
        rt = self.runtime()
        from ._status import check_status

        check_status(status, call, rt.spec.vendor, rt.spec.statuses, name_of=rt.name_of, op="reduce")
        if stream is None:
            rt.stream_synchronize(0, op="reduce")

    # ---------------------------------------------------------- buffer claims
    @hookimpl
    def uniccl_dlpack_device_types(self) -> list:
        return list(self.dlpack_types)

    @hookimpl
    def uniccl_claim_pointer(self, ptr: int, device_type: int, device_id: int):
        if device_type not in self.dlpack_types:
            return None
        try:
            rt = self.runtime()
        except PlatformUnavailable:
            return None
        return rt.pointer_device(ptr)

    @hookimpl
    def uniccl_native_collectives(self):
        from .._plugins import _blocked_names

        blocked = _blocked_names()
        if self.ccl_spec is None or self.ccl_spec.prefix in blocked or "nccl" in blocked:
            return None  # UNICCL_PLUGINS=^nccl (any NCCL-class library) or ^mccl: stage through host memory
        ccl, _ = self.ccl()
        return NativeNccl(self, ccl) if ccl is not None else None
