"""Plugin discovery, selection and backend resolution.

Discovery is lazy (first communicator or ``uniccl info``), records every failure
with its reason and never lets one broken plugin break the others.  Selection
honours ``UNICCL_PLATFORM`` (forced order, fatal when none works) and
``UNICCL_PLUGINS=^a,b`` (blocked names); otherwise the highest-priority available
plugin wins (cpu has priority 0).
"""

from __future__ import annotations

import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

import pluggy

from . import _env, hookspecs
from ._errors import PlatformUnavailable

ENTRY_POINT_GROUP = "uniccl.plugins"

# Hooks every platform must implement to carry a communicator.
REQUIRED_HOOKS = (
    "uniccl_platform_info",
    "uniccl_probe",
    "uniccl_reduce",
    "uniccl_scale",
    "uniccl_memcpy",
    "uniccl_host_alloc",
    "uniccl_host_free",
)


@dataclass
class PluginRecord:
    name: str
    distribution: str = ""
    version: str = ""
    state: str = "unknown"  # available | unavailable | failed | rejected | blocked
    reason: str = ""
    priority: int = 0
    info: dict = field(default_factory=dict)
    probe: dict = field(default_factory=dict)
    module: object = None
    api: int = 0  # the plugin API version in use with it (the highest both sides implement)
    adapted: str = ""  # what the adapter of an older version does for it ("" at the current version)

    @property
    def available(self) -> bool:
        return self.state == "available"


class Backend:
    """The chosen plugin's hook implementations as plain attributes.

    Resolved once per communicator: ``backend.reduce(...)`` is a direct function
    call (no pluggy dispatch on the hot path).  Hooks the plugin does not
    implement are None.
    """

    # Set in __init__, one per hook of ``hookspecs`` (the ``uniccl_`` prefix dropped); their
    # signatures are the hook specifications'.  REQUIRED_HOOKS: a plugin without one is rejected
    # at discovery, so a backend always has them.
    platform_info: Callable[[], dict]
    probe: Callable[[], dict]
    host_alloc: Callable[[int], int]
    host_free: Callable[[int], None]
    memcpy: Callable[[int, int, int, int, Any], None]
    reduce: Callable[[int, int, int, int, int, int, Any], None]
    scale: Callable[[int, int, int, int, int, Any], None]
    # The optional hooks: None where the plugin does not implement them.
    mem_alloc: Callable[[int, int], int] | None
    mem_free: Callable[[int, int], None] | None
    stream_create: Callable[[int], Any] | None
    stream_destroy: Callable[[Any], None] | None
    stream_synchronize: Callable[[Any], None] | None
    stream_wait_event: Callable[[Any, Any], None] | None
    event_create: Callable[[int], Any] | None
    event_destroy: Callable[[Any], None] | None
    event_record: Callable[[Any, Any], None] | None
    event_query: Callable[[Any], bool] | None
    event_synchronize: Callable[[Any], None] | None
    host_reduce_kernel: Callable[[], Any] | None
    dlpack_device_types: Callable[[], list] | None
    claim_pointer: Callable[[int, int, int], int | None] | None
    native_collectives: Callable[[], Any] | None

    def __init__(self, record: PluginRecord, impls: dict):
        self.name = record.name
        self.record = record
        for hook in _hook_names():
            setattr(self, hook[len("uniccl_") :], impls.get(hook))

    def __repr__(self):
        return f"<Backend {self.name}>"


def _v1(module) -> str:
    """API 1 → 2: ``uniccl_transports`` is gone (nothing ever called it); every other hook of
    version 1 is the same in version 2."""
    return "its uniccl_transports hook is not called" if hasattr(module, "uniccl_transports") else "nothing to adapt"


# The adapter of each older plugin API version still accepted (UNICCL_PLUGIN_API_OLDEST and up):
# what it does for a plugin of that version, said in ``uniccl info``.
ADAPTERS: dict[int, Callable[[object], str]] = {1: _v1}


def api_range(declared) -> tuple[int, int]:
    """The ``[lowest, highest]`` plugin API versions a plugin declares (an int: that one only);
    ValueError saying what is wrong with anything else."""
    if isinstance(declared, int) and not isinstance(declared, bool):
        return declared, declared
    if (
        isinstance(declared, (list, tuple))
        and len(declared) == 2
        and all(isinstance(v, int) and not isinstance(v, bool) for v in declared)
        and declared[0] <= declared[1]
    ):
        return declared[0], declared[1]
    raise ValueError(f"api_version must be an int or a [lowest, highest] pair of ints, got {declared!r}")


def negotiate(declared) -> tuple[int, str]:
    """(the version to use with a plugin that declares ``declared``, "") or (0, why it is rejected)."""
    oldest, newest = hookspecs.UNICCL_PLUGIN_API_OLDEST, hookspecs.UNICCL_PLUGIN_API
    try:
        low, high = api_range(declared)
    except ValueError as exc:
        return 0, str(exc)
    ours = f"this uniccl supports plugin API {oldest}..{newest}"
    theirs = f"plugin API {low}" + (f"..{high}" if high != low else "")
    if low > newest:
        return 0, f"plugin implements {theirs}, {ours}: upgrade uniccl"
    if high < oldest:
        return 0, f"plugin implements {theirs}, {ours}: upgrade the plugin"
    return min(high, newest), ""


def _hook_names():
    return [n for n in dir(hookspecs) if n.startswith("uniccl_")]


def _blocked_names() -> set:
    spec = _env.text("UNICCL_PLUGINS")  # "^a,b" (InvalidArgument without the ^)
    if not spec.startswith("^"):
        return set()
    return {n.strip() for n in spec[1:].split(",") if n.strip()}


def _forced_names() -> list:
    return _env.names("UNICCL_PLATFORM")


class PluginManager:
    def __init__(self):
        self._pm = pluggy.PluginManager("uniccl")
        self._pm.add_hookspecs(hookspecs)
        self._records: dict[str, PluginRecord] = {}
        self._backends: dict[int, Backend] = {}  # id(record) -> its hooks, resolved once
        self._discovered = False
        self._lock = threading.Lock()

    # ---------------------------------------------------------------- discovery
    def discover(self) -> list[PluginRecord]:
        with self._lock:
            if not self._discovered:
                blocked = _blocked_names()
                for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
                    if ep.name in self._records:
                        continue  # the same plugin seen twice on sys.path
                    self._records[ep.name] = self._load(ep, blocked)
                self._discovered = True
            return sorted(self._records.values(), key=lambda r: (r.priority, r.name))

    def register(self, module, name: str | None = None) -> PluginRecord:
        """Register a plugin object directly (tests, embedding); probes it like discovery."""
        with self._lock:
            rec = PluginRecord(name=name or getattr(module, "__name__", "plugin"))
            self._records[rec.name] = self._validate(rec, module)
            return self._records[rec.name]

    def _load(self, ep, blocked) -> PluginRecord:
        rec = PluginRecord(name=ep.name)
        if ep.dist is not None:
            rec.distribution, rec.version = ep.dist.name, ep.dist.version
        if ep.name in blocked:
            rec.state, rec.reason = "blocked", "blocked by UNICCL_PLUGINS"
            return rec
        try:
            module = ep.load()
        except Exception as exc:  # a broken plugin must not break the others
            rec.state, rec.reason = "failed", f"import failed: {_one_line(exc)}"
            return rec
        return self._validate(rec, module)

    def _validate(self, rec: PluginRecord, module) -> PluginRecord:
        try:
            self._pm.register(module, name=rec.name)
        except Exception as exc:
            rec.state, rec.reason = "failed", f"invalid hooks: {_one_line(exc)}"
            return rec
        rec.module = module
        try:
            rec.info = dict(self._impl(module, "uniccl_platform_info")())
            rec.priority = int(rec.info.get("priority", 0))
            rec.version = rec.version or str(rec.info.get("version", ""))
        except Exception as exc:
            return self._reject(rec, "failed", f"uniccl_platform_info raised: {_one_line(exc)}")
        rec.api, why = negotiate(rec.info.get("api_version"))
        if why:
            return self._reject(rec, "rejected", why)
        if rec.api != hookspecs.UNICCL_PLUGIN_API:
            rec.adapted = ADAPTERS[rec.api](module)
        missing = [h for h in REQUIRED_HOOKS if self._impl(module, h) is None]
        if missing:
            return self._reject(rec, "rejected", f"missing required hooks: {', '.join(missing)}")
        try:
            rec.probe = dict(self._impl(module, "uniccl_probe")())
        except Exception as exc:
            return self._reject(rec, "failed", f"probe raised: {_one_line(exc)}")
        if rec.probe.get("available"):
            rec.state, rec.reason = "available", ""
        else:
            rec.state, rec.reason = "unavailable", str(rec.probe.get("reason") or "probe said no")
        return rec

    def _reject(self, rec, state, reason):
        self._pm.unregister(rec.module)
        rec.state, rec.reason, rec.module = state, reason, None
        return rec

    def _impl(self, module, hook: str):
        for impl in getattr(self._pm.hook, hook).get_hookimpls():
            if impl.plugin is module:
                return impl.function
        return None

    # ---------------------------------------------------------------- selection
    def choose(self, platform: str | None = None) -> tuple[PluginRecord, str]:
        """Pick the platform; return (record, why)."""
        records = {r.name: r for r in self.discover()}
        forced = [platform] if platform else _forced_names()
        if forced:
            source = "argument platform=" if platform else "UNICCL_PLATFORM="
            for name in forced:
                rec = records.get(name)
                if rec is not None and rec.available:
                    return rec, f"forced by {source}{','.join(forced)}"
            detail = "; ".join(
                f"{n}: {records[n].state}: {records[n].reason}" if n in records else f"{n}: not installed"
                for n in forced
            )
            raise PlatformUnavailable(
                f"no platform of {source}{','.join(forced)} is usable ({detail}); "
                f"installed plugins: {', '.join(records) or 'none'}",
                op="init",
            )
        usable = [r for r in records.values() if r.available]
        if not usable:
            detail = "; ".join(f"{r.name}: {r.state}: {r.reason}" for r in records.values()) or "none installed"
            raise PlatformUnavailable(f"no usable platform plugin ({detail}); install uniccl-cpu", op="init")
        best = max(usable, key=lambda r: (r.priority, r.name))
        others = [
            f"{r.name} {r.state}" + (f" ({r.reason})" if r.reason else "") for r in records.values() if r is not best
        ]
        why = f"highest-priority available plugin (priority {best.priority})"
        return best, why + (f"; others: {', '.join(others)}" if others else "")

    def host_backend(self, fallback: Backend) -> Backend:
        """The cpu plugin's backend, for host-memory work under a device platform
        (``fallback`` when it is not available)."""
        rec = {r.name: r for r in self.discover()}.get("cpu")
        return self.backend(rec) if rec is not None and rec.available else fallback

    def backend(self, record: PluginRecord) -> Backend:
        found = self._backends.get(id(record))
        if found is None or found.record is not record:
            found = Backend(record, {h: self._impl(record.module, h) for h in _hook_names()})
            self._backends[id(record)] = found
        return found


def _one_line(exc: BaseException) -> str:
    text = "".join(traceback.format_exception_only(type(exc), exc)).strip()
    return " ".join(text.split())


_manager: PluginManager | None = None
_manager_lock = threading.Lock()


def manager() -> PluginManager:
    global _manager
    with _manager_lock:
        if _manager is None:
            _manager = PluginManager()
        return _manager


def reset_manager() -> None:
    """Forget discovery results (tests that change UNICCL_* variables)."""
    global _manager
    with _manager_lock:
        _manager = None
