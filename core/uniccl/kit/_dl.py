"""Find and open vendor libraries at run time, saying where we looked.

Search order: the vendor's environment variables (e.g. ``$CUDA_HOME/lib64``),
its usual install folders, the library folders of vendor wheels on PyPI (the
``nvidia-*`` wheels put ``libcudart.so.12`` under ``site-packages/nvidia/...``),
then the system loader (``LD_LIBRARY_PATH``, ld.so.cache).  The first that loads
wins; when none does, the reason lists every place tried.
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

#: Collective libraries loaded in this process: {symbol prefix: (plugin name, path)}, the
#: first plugin to load one of a prefix.  MetaX's and Moore's CCLs are both ``libmccl``
#: with ``mccl*`` symbols: a plugin whose spec says the prefix is exclusive refuses to load
#: its own when another plugin's is here (see :func:`ccl_conflict`).
LOADED_CCLS: dict = {}
_ccl_lock = threading.Lock()


def note_ccl(prefix: str, plugin: str, path: str) -> None:
    """Record that ``plugin`` loaded the collective library ``path`` (symbols ``prefix*``)."""
    with _ccl_lock:
        LOADED_CCLS.setdefault(prefix, (plugin, path))


def ccl_conflict(prefix: str, plugin: str, exclusive: str) -> str:
    """Why ``plugin`` must not load its ``prefix*`` library here ("" when it may): another
    plugin loaded one with the same prefix and ``exclusive`` (the spec's reason) is set."""
    with _ccl_lock:
        owner = LOADED_CCLS.get(prefix)
    if not exclusive or owner is None or owner[0] == plugin:
        return ""
    return f"lib{prefix} of {owner[0]} already loaded in this process: {exclusive}"


@dataclass(frozen=True)
class LibrarySearch:
    """Where one vendor library may be.

    ``names``: file names, preferred first (``libcudart.so.12``, ``libcudart.so``).
    ``env``: (variable, sub-folders) pairs, e.g. ("CUDA_HOME", ("lib64", "lib")).
    ``dirs``: fixed folders.  ``wheels``: (python package, sub-folder) of PyPI wheels,
    e.g. ("nvidia.cuda_runtime", "lib").
    """

    names: tuple
    env: tuple = ()
    dirs: tuple = ()
    wheels: tuple = ()
    system: bool = True
    extra: tuple = field(default=(), compare=False)

    def places(self) -> list[tuple[str, str | None]]:
        """[(description, folder or None when that source is absent)] in search order."""
        out = []
        for var, subs in self.env:
            root = os.environ.get(var)
            for sub in subs:
                out.append((f"${var}/{sub}" + ("" if root else " (unset)"), os.path.join(root, sub) if root else None))
        for d in self.dirs:
            out.append((d, d))
        for package, sub in self.wheels:
            folder = _wheel_folder(package, sub)
            out.append((f"{package} wheel" + ("" if folder else " (not installed)"), folder))
        return out


def _wheel_folder(package: str, sub: str) -> str | None:
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for base in spec.submodule_search_locations:
        folder = os.path.join(base, sub)
        if os.path.isdir(folder):
            return folder
    return None


def find_library(search: LibrarySearch) -> tuple[str | None, list[str]]:
    """(path of the first existing candidate file or None, descriptions searched)."""
    tried = []
    for desc, folder in search.places():
        tried.append(desc)
        if folder is None:
            continue
        for name in search.names:
            path = os.path.join(folder, name)
            if os.path.exists(path):
                return path, tried
    return None, tried


def load_library(search: LibrarySearch, mode: int = ctypes.RTLD_LOCAL) -> tuple[ctypes.CDLL | None, str, str]:
    """(library or None, path or name loaded, reason when None).  RTLD_LOCAL: CUDA's and
    CoreX's runtimes export the same ``cuda*`` names (MetaX's and Moore's CCLs the same
    ``mccl*``), and two plugins probing in one process must not bind to each other's."""
    path, tried = find_library(search)
    errors = []
    if path is not None:
        try:
            return ctypes.CDLL(path, mode=mode), path, ""
        except OSError as exc:
            errors.append(f"{path}: {exc}")
    if search.system:
        tried.append("system loader path")
        for name in search.names:
            try:
                return ctypes.CDLL(name, mode=mode), name, ""
            except OSError:
                continue
    where = ", ".join(tried)
    if errors:
        return None, "", f"{search.names[0]} could not be loaded ({'; '.join(errors)}; searched: {where})"
    return None, "", f"{search.names[0]} not found (searched: {where})"


class BoundLibrary:
    """A vendor library bound once with ctypes.  Subclasses give ``signatures()``
    ({name without prefix: argtypes}, every function returning an int status),
    ``REQUIRED`` names and ``KIND`` (for messages); ``load(spec)`` never raises."""

    REQUIRED: tuple = ()
    KIND = "library"
    NAME_FN = ""  # "<prefix><NAME_FN>(status) -> const char*" gives a status its name, if exported

    def __init__(self, spec, lib: ctypes.CDLL, path: str):
        self.spec, self.lib, self.path = spec, lib, path
        self._fns: dict[str, Callable[..., int] | None] = {}  # None: the library lacks it
        for name, argtypes in self.signatures().items():
            fn = getattr(lib, spec.prefix + name, None)
            if fn is not None:
                fn.argtypes, fn.restype = argtypes, ctypes.c_int
            self._fns[name] = fn
        self._name_fn = getattr(lib, spec.prefix + self.NAME_FN, None) if self.NAME_FN else None
        if self._name_fn is not None:
            self._name_fn.argtypes, self._name_fn.restype = [ctypes.c_int], ctypes.c_char_p
        missing = [spec.prefix + n for n in self.REQUIRED if self._fns.get(n) is None]
        if missing:
            raise OSError(f"{path} lacks {', '.join(missing)}")

    def signatures(self) -> dict:
        return {}

    @classmethod
    def load(cls, spec):
        """(bound library or None, reason when None)."""
        lib, path, reason = load_library(spec.search)
        if lib is None:
            return None, reason
        try:
            return cls(spec, lib, path), ""
        except OSError as exc:
            return None, f"{path} is not a usable {spec.vendor} {cls.KIND}: {exc}"

    def name_of(self, status: int) -> str | None:
        if self._name_fn is None:
            return None
        raw = self._name_fn(status)
        return raw.decode() if raw else None
