"""Build and load the vendor ABI emulation in ``tests/emulation/``.

The C sources there export the CUDA runtime and NCCL symbols over host memory
(see the comments at the top of ``cudart_emu.c`` and ``nccl_emu.c``).  This
module compiles them into a vendor-like tree so plugin bindings can find them
the way they find the real SDK::

    nvidia:   <out>/cuda/lib64/libcudart.so.12 (+ libcudart.so)
              <out>/nccl/lib/libnccl.so.2      (+ libnccl.so)
    iluvatar: <out>/corex/lib64/libcudart.so.10.2 (+ libcudart.so)
              <out>/corex/lib64/libnccl.so.2      (+ libnccl.so)
    metax:    <out>/maca/lib/libmcruntime.so + libmccl.so   (mc*, mccl*)
    moore:    <out>/musa/lib/libmusart.so + libmccl.so      (musa*, mccl*)
    cambricon: <out>/neuware/lib64/libcnrt.so + libcncl.so  (cnrt*, cncl*)

metax and moore are the same C sources compiled to objects whose exported
``cuda*``/``nccl*`` symbols are renamed (``objcopy --redefine-syms``) before
linking; the names they count, inject and report follow the renaming.
cambricon has an ABI of its own (names, argument orders, status values):
``cnrt_emu.c``/``cncl_emu.c`` translate it onto the same sources, compiled in
with their symbols renamed to ``inner_cuda*``/``inner_nccl*`` and hidden.

libnccl is linked against the emulated libcudart (real NCCL needs libcudart
too), so both must come from the same tree.  Builds are cached per process in
a temporary folder (or in ``$UNICCL_EMU_BUILD_DIR``, which ``env()`` passes on
to child processes so they reuse it) and rebuilt when the sources change.

Typical use::

    from _emulation import build, load, env, require
    info = require("nvidia")                 # pytest.skip when no C compiler
    emu = load("nvidia")                     # ctypes handles, signatures declared
    emu.fail("cudaMemcpyAsync", 700)         # inject; emu.clear() undoes
    subprocess.run(cmd, env=env(info))       # children see the same libraries
"""

from __future__ import annotations

import atexit
import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

SRC_DIR = Path(__file__).resolve().parent / "emulation"
SOURCES = ("emu.h", "cudart_emu.c", "nccl_emu.c", "cnrt_emu.c", "cncl_emu.c")
CFLAGS = ["-O2", "-shared", "-fPIC", "-pthread", "-Wall", "-Wextra", "-fvisibility=hidden"]

#: Layout and flavour of each emulated vendor.  ``home_env`` is the variable
#: the vendor's tools use for the SDK root (CoreX: COREX_HOME, default
#: /usr/local/corex, libraries in lib64/).
KINDS = {
    "nvidia": {
        "root": "cuda",
        "home_env": "CUDA_HOME",
        "cudart_dir": "cuda/lib64",
        "cudart": "libcudart.so.12",
        "nccl_dir": "nccl/lib",
        "nccl": "libnccl.so.2",
        "defines": [],
        "nccl_version": 22105,
        "runtime_version": 12040,
    },
    "iluvatar": {
        "root": "corex",
        "home_env": "COREX_HOME",
        "cudart_dir": "corex/lib64",
        "cudart": "libcudart.so.10.2",
        "nccl_dir": "corex/lib64",
        "nccl": "libnccl.so.2",
        "defines": ["-DEMU_COREX"],
        "nccl_version": 22403,
        "runtime_version": 10020,
    },
    # MACA: libmcruntime + MCCL under $MACA_PATH (default /opt/maca); versions are guesses
    "metax": {
        "root": "maca",
        "home_env": "MACA_PATH",
        "cudart_dir": "maca/lib",
        "cudart": "libmcruntime.so",
        "nccl_dir": "maca/lib",
        "nccl": "libmccl.so",
        "defines": ['-DEMU_DEVICE_NAME="MetaX emulated device"', "-DEMU_RUNTIME_VERSION=2320"],
        "nccl_version": 21600,
        "runtime_version": 2320,
        "prefixes": ("mc", "mccl"),
    },
    # MUSA: libmusart + Moore's MCCL under $MUSA_HOME (default /usr/local/musa)
    "moore": {
        "root": "musa",
        "home_env": "MUSA_HOME",
        "cudart_dir": "musa/lib",
        "cudart": "libmusart.so",
        "nccl_dir": "musa/lib",
        "nccl": "libmccl.so",
        "defines": ['-DEMU_DEVICE_NAME="Moore Threads emulated device"', "-DEMU_RUNTIME_VERSION=4020"],
        "nccl_version": 21600,
        "runtime_version": 4020,
        "prefixes": ("musa", "mccl"),
    },
    # Neuware: CNRT + CNCL under $NEUWARE_HOME (default /usr/local/neuware), own ABI (cnrt_emu.c)
    "cambricon": {
        "root": "neuware",
        "home_env": "NEUWARE_HOME",
        "cudart_dir": "neuware/lib64",
        "cudart": "libcnrt.so",
        "nccl_dir": "neuware/lib64",
        "nccl": "libcncl.so",
        "defines": ['-DEMU_DEVICE_NAME="Cambricon emulated MLU"'],
        "nccl_version": 12500,
        "runtime_version": 61401,
        "prefixes": ("cnrt", "cncl"),
        "wrapped": ("cnrt_emu.c", "cncl_emu.c"),
    },
}


class EmulationUnavailable(RuntimeError):
    """No C compiler, or the build failed (the message says which)."""


_lock = threading.Lock()
_built: dict = {}
_loaded: dict = {}
_session_dir: Path | None = None


def compiler() -> str | None:
    """The C compiler used for the emulation ($CC, cc or gcc), or None."""
    cc = os.environ.get("CC")
    if cc and shutil.which(cc):
        return shutil.which(cc)
    return shutil.which("cc") or shutil.which("gcc")


def source_hash() -> str:
    h = hashlib.sha256()
    for name in SOURCES:
        h.update(name.encode() + b"\0" + (SRC_DIR / name).read_bytes())
    h.update(" ".join(CFLAGS).encode())
    return h.hexdigest()[:16]


def _cache_root() -> Path:
    global _session_dir
    shared = os.environ.get("UNICCL_EMU_BUILD_DIR")
    if shared:
        Path(shared).mkdir(parents=True, exist_ok=True)
        return Path(shared)
    if _session_dir is None:
        _session_dir = Path(tempfile.mkdtemp(prefix="uniccl-emu-"))
        atexit.register(shutil.rmtree, _session_dir, True)
    return _session_dir


def _info(kind: str, out: Path) -> dict:
    k = KINDS[kind]
    cudart_dir, nccl_dir = out / k["cudart_dir"], out / k["nccl_dir"]
    lib_dirs = [str(cudart_dir)] + ([str(nccl_dir)] if nccl_dir != cudart_dir else [])
    return {
        "kind": kind,
        "out": str(out),
        "root": str(out / k["root"]),  # CUDA_HOME / COREX_HOME-like
        "home_env": k["home_env"],
        "cudart": str(cudart_dir / k["cudart"]),
        "nccl": str(nccl_dir / k["nccl"]),
        "cudart_dir": str(cudart_dir),
        "nccl_dir": str(nccl_dir),
        "nccl_root": str(nccl_dir.parent),
        "lib_dirs": lib_dirs,
        "nccl_version": k["nccl_version"],
        "runtime_version": k["runtime_version"],
        "prefixes": k.get("prefixes", ("cuda", "nccl")),  # runtime, collective library symbol prefixes
    }


def _run(cmd: list) -> None:
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise EmulationUnavailable(f"compiling the emulation failed: {' '.join(cmd)}\n{r.stderr}")


def _compile(kind: str, out: Path, cc: str) -> None:
    k = KINDS[kind]
    if "wrapped" in k:
        return _compile_wrapped(kind, out, cc)
    if "prefixes" in k:
        return _compile_renamed(kind, out, cc)
    cudart_dir, nccl_dir = out / k["cudart_dir"], out / k["nccl_dir"]
    cudart_dir.mkdir(parents=True, exist_ok=True)
    nccl_dir.mkdir(parents=True, exist_ok=True)
    cudart = cudart_dir / k["cudart"]
    _run([cc, *CFLAGS, *k["defines"], f"-Wl,-soname,{k['cudart']}", "-o", str(cudart), str(SRC_DIR / "cudart_emu.c")])
    (cudart_dir / "libcudart.so").symlink_to(k["cudart"])
    rpath = "$ORIGIN/" + os.path.relpath(cudart_dir, nccl_dir) if nccl_dir != cudart_dir else "$ORIGIN"
    nccl = nccl_dir / k["nccl"]
    _run(
        [
            cc,
            *CFLAGS,
            *k["defines"],
            f"-DEMU_NCCL_VERSION={k['nccl_version']}",
            f'-DEMU_CUDART_SONAME="{k["cudart"]}"',
            f"-Wl,-soname,{k['nccl']}",
            "-o",
            str(nccl),
            str(SRC_DIR / "nccl_emu.c"),
            "-Wl,--no-as-needed",
            f"-L{cudart_dir}",
            f"-l:{k['cudart']}",
            f"-Wl,-rpath,{rpath}",
            "-ldl",
            "-lrt",
        ]
    )
    (nccl_dir / "libnccl.so").symlink_to(k["nccl"])


def _objcopy() -> str:
    tool = shutil.which("objcopy")
    if not tool:
        raise EmulationUnavailable("no objcopy (binutils) found to rename the emulation's symbols")
    return tool


def _rename(obj: Path, prefixes: tuple) -> None:
    """Rename the object's exported cuda*/nccl* symbols (definitions and references) to the
    vendor's prefixes; uniccl_emu_* stay as they are."""
    rt, ccl = prefixes
    r = subprocess.run(["nm", "-g", "--defined-only", str(obj)], capture_output=True, text=True)
    if r.returncode != 0:
        raise EmulationUnavailable(f"nm failed on {obj}: {r.stderr}")
    pairs = []
    for line in r.stdout.splitlines():
        name = line.split()[-1] if line.split() else ""
        if name.startswith("cuda"):
            pairs.append(f"{name} {rt}{name[4:]}")
        elif name.startswith("nccl"):
            pairs.append(f"{name} {ccl}{name[4:]}")
    table = obj.with_suffix(".syms")
    table.write_text("\n".join(pairs) + "\n")
    _run([_objcopy(), f"--redefine-syms={table}", str(obj)])


def _compile_renamed(kind: str, out: Path, cc: str) -> None:
    """The same sources as nvidia's, compiled to objects, symbols renamed, then linked into
    the vendor's layout (one folder holds the runtime and the collective library)."""
    k = KINDS[kind]
    rt, ccl = k["prefixes"]
    cudart_dir, nccl_dir = out / k["cudart_dir"], out / k["nccl_dir"]
    cudart_dir.mkdir(parents=True, exist_ok=True)
    nccl_dir.mkdir(parents=True, exist_ok=True)
    objs = out / "obj"
    objs.mkdir(exist_ok=True)
    cflags = [f for f in CFLAGS if f != "-shared"]
    vendor = [*k["defines"], f'-DEMU_RT_PREFIX="{rt}"', f'-DEMU_CCL_PREFIX="{ccl}"', "-DEMU_NO_PROPS_V2"]
    rt_obj, ccl_obj = objs / "cudart_emu.o", objs / "nccl_emu.o"
    _run([cc, *cflags, *vendor, "-c", "-o", str(rt_obj), str(SRC_DIR / "cudart_emu.c")])
    _run(
        [
            cc,
            *cflags,
            *vendor,
            f"-DEMU_NCCL_VERSION={k['nccl_version']}",
            f'-DEMU_CUDART_SONAME="{k["cudart"]}"',
            "-c",
            "-o",
            str(ccl_obj),
            str(SRC_DIR / "nccl_emu.c"),
        ]
    )
    _rename(rt_obj, k["prefixes"])
    _rename(ccl_obj, k["prefixes"])
    _run([cc, "-shared", "-pthread", f"-Wl,-soname,{k['cudart']}", "-o", str(cudart_dir / k["cudart"]), str(rt_obj)])
    rpath = "$ORIGIN/" + os.path.relpath(cudart_dir, nccl_dir) if nccl_dir != cudart_dir else "$ORIGIN"
    _run(
        [
            cc,
            "-shared",
            "-pthread",
            f"-Wl,-soname,{k['nccl']}",
            "-o",
            str(nccl_dir / k["nccl"]),
            str(ccl_obj),
            "-Wl,--no-as-needed",
            f"-L{cudart_dir}",
            f"-l:{k['cudart']}",
            f"-Wl,-rpath,{rpath}",
            "-ldl",
            "-lrt",
        ]
    )
    shutil.rmtree(objs)


def _compile_wrapped(kind: str, out: Path, cc: str) -> None:
    """A vendor with an ABI of its own: the CUDA/NCCL emulation compiled with its symbols
    renamed to inner_cuda*/inner_nccl*, plus the vendor's translation layer; a version
    script exports only the vendor's names and the emulation's control functions."""
    k = KINDS[kind]
    rt_src, ccl_src = k["wrapped"]
    rt, ccl = k["prefixes"]
    lib_dir = out / k["cudart_dir"]
    lib_dir.mkdir(parents=True, exist_ok=True)
    objs = out / "obj"
    objs.mkdir(exist_ok=True)
    cflags = [f for f in CFLAGS if f != "-shared"]
    inner = [
        *k["defines"],
        '-DEMU_RT_PREFIX="inner_cuda"',
        '-DEMU_CCL_PREFIX="inner_nccl"',
        "-DEMU_INT16",
        f"-DEMU_NCCL_VERSION={k['nccl_version']}",
        f'-DEMU_CUDART_SONAME="{k["cudart"]}"',
    ]
    o = {name: objs / (name + ".o") for name in ("cudart_emu", "nccl_emu", "rt", "ccl")}
    _run([cc, *cflags, *inner, "-c", "-o", str(o["cudart_emu"]), str(SRC_DIR / "cudart_emu.c")])
    _run([cc, *cflags, *inner, "-c", "-o", str(o["nccl_emu"]), str(SRC_DIR / "nccl_emu.c")])
    for name in ("cudart_emu", "nccl_emu"):
        _rename(o[name], ("inner_cuda", "inner_nccl"))
    _run([cc, *cflags, "-c", "-o", str(o["rt"]), str(SRC_DIR / rt_src)])
    _run([cc, *cflags, "-c", "-o", str(o["ccl"]), str(SRC_DIR / ccl_src)])
    for prefix, _lib in ((rt, k["cudart"]), (ccl, k["nccl"])):
        (objs / f"{prefix}.map").write_text(f"{{ global: {prefix}*; uniccl_emu_*; local: *; }};\n")
    _run(
        [
            cc,
            "-shared",
            "-pthread",
            f"-Wl,-soname,{k['cudart']}",
            f"-Wl,--version-script={objs / (rt + '.map')}",
            "-o",
            str(lib_dir / k["cudart"]),
            str(o["cudart_emu"]),
            str(o["rt"]),
        ]
    )
    _run(
        [
            cc,
            "-shared",
            "-pthread",
            f"-Wl,-soname,{k['nccl']}",
            f"-Wl,--version-script={objs / (ccl + '.map')}",
            "-o",
            str(lib_dir / k["nccl"]),
            str(o["nccl_emu"]),
            str(o["ccl"]),
            "-Wl,--no-as-needed",
            f"-L{lib_dir}",
            f"-l:{k['cudart']}",
            "-Wl,-rpath,$ORIGIN",
            "-ldl",
            "-lrt",
        ]
    )
    shutil.rmtree(objs)


def build(kind: str = "nvidia", outdir=None) -> dict:
    """Compile the emulation of ``kind`` ("nvidia", "iluvatar", "metax", "moore", "cambricon");
    return its paths.

    Keys: ``root`` (CUDA_HOME/COREX_HOME-like folder), ``home_env`` (that
    variable's name), ``cudart``/``nccl`` (library files), ``cudart_dir``/
    ``nccl_dir``/``lib_dirs``, ``nccl_root`` (NCCL_HOME-like), versions.
    Raises EmulationUnavailable without a C compiler or when compiling fails.
    """
    if kind not in KINDS:
        raise ValueError(f"unknown emulation kind {kind!r}; expected one of {sorted(KINDS)}")
    digest = source_hash()
    out = Path(outdir) if outdir else _cache_root() / f"{kind}-{digest}"
    key = (kind, str(out))
    with _lock:
        if _built.get(key) == digest:
            return _info(kind, out)
        stamp = out / ".stamp"
        if not (stamp.exists() and stamp.read_text() == digest):
            cc = compiler()
            if not cc:
                raise EmulationUnavailable("no C compiler (cc/gcc) found to build the ABI emulation")
            tmp = out.parent / f".{out.name}.tmp{os.getpid()}"
            shutil.rmtree(tmp, ignore_errors=True)
            try:
                _compile(kind, tmp, cc)
                (tmp / ".stamp").write_text(digest)
                if out.exists():
                    shutil.rmtree(out, ignore_errors=True)
                try:
                    os.rename(tmp, out)
                except OSError:  # another process won the race; its build is the same
                    if not (stamp.exists() and stamp.read_text() == digest):
                        raise
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
        _built[key] = digest
        return _info(kind, out)


def require(kind: str = "nvidia", outdir=None) -> dict:
    """``build()`` for tests: skip (with the reason) when the emulation cannot be built."""
    import pytest

    if compiler() is None:
        pytest.skip("ABI emulation needs a C compiler (cc/gcc)")
    return build(kind, outdir)


def env(info: dict, base: dict | None = None, **extra) -> dict:
    """Environment for a child process that should find this emulation.

    Prepends the library folders to LD_LIBRARY_PATH, sets the vendor's home
    variable (CUDA_HOME, COREX_HOME, MACA_PATH, MUSA_HOME, NEUWARE_HOME; NCCL_HOME for nvidia) and shares the
    build cache.  ``extra`` adds variables (values are str()-ed).
    """
    e = dict(os.environ if base is None else base)
    e["LD_LIBRARY_PATH"] = os.pathsep.join(info["lib_dirs"] + [p for p in [e.get("LD_LIBRARY_PATH")] if p])
    e[info["home_env"]] = info["root"]
    if info["kind"] == "nvidia":
        e["NCCL_HOME"] = info["nccl_root"]
    e["UNICCL_EMU_BUILD_DIR"] = str(Path(info["out"]).parent)
    e.update({k: str(v) for k, v in extra.items()})
    return e


# --------------------------------------------------------------- ctypes side
class ncclUniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_ubyte * 128)]


_P = ctypes.c_void_p
_I = ctypes.c_int
_S = ctypes.c_size_t
_PP = ctypes.POINTER(ctypes.c_void_p)
_PI = ctypes.POINTER(ctypes.c_int)
HOSTFN = ctypes.CFUNCTYPE(None, ctypes.c_void_p)

CUDART_SIGNATURES = {
    "cudaGetDeviceCount": [_PI],
    "cudaSetDevice": [_I],
    "cudaGetDevice": [_PI],
    "cudaRuntimeGetVersion": [_PI],
    "cudaDriverGetVersion": [_PI],
    "cudaDeviceSynchronize": [],
    "cudaGetLastError": [],
    "cudaPeekAtLastError": [],
    "cudaMemGetInfo": [ctypes.POINTER(_S), ctypes.POINTER(_S)],
    "cudaDeviceGetAttribute": [_PI, _I, _I],
    "cudaGetDeviceProperties": [_P, _I],
    "cudaGetDeviceProperties_v2": [_P, _I],
    "cudaMalloc": [_PP, _S],
    "cudaFree": [_P],
    "cudaMallocHost": [_PP, _S],
    "cudaHostAlloc": [_PP, _S, ctypes.c_uint],
    "cudaFreeHost": [_P],
    "cudaPointerGetAttributes": [_P, _P],
    "cudaMemcpy": [_P, _P, _S, _I],
    "cudaMemcpyAsync": [_P, _P, _S, _I, _P],
    "cudaMemset": [_P, _I, _S],
    "cudaMemsetAsync": [_P, _I, _S, _P],
    "cudaStreamCreate": [_PP],
    "cudaStreamCreateWithFlags": [_PP, ctypes.c_uint],
    "cudaStreamDestroy": [_P],
    "cudaStreamSynchronize": [_P],
    "cudaStreamQuery": [_P],
    "cudaStreamWaitEvent": [_P, _P, ctypes.c_uint],
    "cudaLaunchHostFunc": [_P, HOSTFN, _P],
    "cudaEventCreate": [_PP],
    "cudaEventCreateWithFlags": [_PP, ctypes.c_uint],
    "cudaEventRecord": [_P, _P],
    "cudaEventQuery": [_P],
    "cudaEventSynchronize": [_P],
    "cudaEventElapsedTime": [ctypes.POINTER(ctypes.c_float), _P, _P],
    "cudaEventDestroy": [_P],
}

NCCL_SIGNATURES = {
    "ncclGetVersion": [_PI],
    "ncclGetUniqueId": [ctypes.POINTER(ncclUniqueId)],
    "ncclCommInitRank": [_PP, _I, ncclUniqueId, _I],
    "ncclCommDestroy": [_P],
    "ncclCommAbort": [_P],
    "ncclCommGetAsyncError": [_P, _PI],
    "ncclCommCount": [_P, _PI],
    "ncclCommCuDevice": [_P, _PI],
    "ncclCommUserRank": [_P, _PI],
    "ncclAllReduce": [_P, _P, _S, _I, _I, _P, _P],
    "ncclBroadcast": [_P, _P, _S, _I, _I, _P, _P],
    "ncclReduce": [_P, _P, _S, _I, _I, _I, _P, _P],
    "ncclAllGather": [_P, _P, _S, _I, _P, _P],
    "ncclReduceScatter": [_P, _P, _S, _I, _I, _P, _P],
    "ncclSend": [_P, _S, _I, _I, _P, _P],
    "ncclRecv": [_P, _S, _I, _I, _P, _P],
    "ncclGroupStart": [],
    "ncclGroupEnd": [],
}


def vendor_name(name: str, prefixes=("cuda", "nccl")) -> str:
    """``name`` (a cuda*/nccl* name) as the emulation of a vendor with these prefixes exports it."""
    for old, new in zip(("cuda", "nccl"), prefixes):
        if name.startswith(old):
            return new + name[len(old) :]
    return name


def declare(cudart: ctypes.CDLL | None = None, nccl: ctypes.CDLL | None = None, prefixes=("cuda", "nccl")) -> None:
    """Set restype/argtypes of the emulated functions on these handles (cuda*/nccl* names of
    the tables, renamed to ``prefixes`` for the metax and moore emulations)."""
    for lib, table in ((cudart, CUDART_SIGNATURES), (nccl, NCCL_SIGNATURES)):
        if lib is None:
            continue
        for name, args in table.items():
            fn = getattr(lib, vendor_name(name, prefixes), None)
            if fn is not None:
                fn.argtypes, fn.restype = args, ctypes.c_int
        for name in ("cudaGetErrorName", "cudaGetErrorString", "ncclGetErrorString", "ncclGetLastError"):
            fn = getattr(lib, vendor_name(name, prefixes), None)
            if fn is not None:
                fn.restype = ctypes.c_char_p
        lib.uniccl_emu_fail.argtypes = [ctypes.c_char_p, _I, _I, _I]
        lib.uniccl_emu_fail.restype = _I
        lib.uniccl_emu_calls.argtypes = [ctypes.c_char_p]
        lib.uniccl_emu_calls.restype = _I
    last = getattr(nccl, vendor_name("ncclGetLastError", prefixes), None) if nccl is not None else None
    if last is not None:  # not in CNCL
        last.argtypes = [_P]


class Emulation:
    """Loaded emulation: ``cudart``/``nccl`` ctypes handles plus injection helpers.

    The handles are the same library instances a plugin gets when it dlopens
    the same files in this process, so ``fail``/``calls`` act on the plugin's
    calls too.  Counters and rules are per process.
    """

    def __init__(self, info: dict):
        self.info = info
        self.cudart = ctypes.CDLL(info["cudart"])
        self.nccl = ctypes.CDLL(info["nccl"])
        declare(self.cudart, self.nccl, info["prefixes"])

    def fail(self, call: str, status: int, after: int = 0, times: int = -1) -> None:
        """Make ``call`` return ``status`` after ``after`` good calls, ``times`` times (-1: forever)."""
        if self.cudart.uniccl_emu_fail(call.encode(), status, after, times) != 0:
            raise RuntimeError("too many distinct calls in the injection table")

    def clear(self) -> None:
        """Remove every injection rule and reset the call counters."""
        self.cudart.uniccl_emu_fail(None, 0, 0, 0)

    def calls(self, call: str) -> int:
        """How many times ``call`` was entered since the last clear()."""
        return self.cudart.uniccl_emu_calls(call.encode())


def load(kind: str = "nvidia", outdir=None) -> Emulation:
    """Build (if needed) and load the emulation of ``kind`` into this process."""
    info = build(kind, outdir)
    key = info["cudart"]
    if key not in _loaded:
        _loaded[key] = Emulation(info)
    return _loaded[key]


if __name__ == "__main__":  # python tests/_emulation.py [nvidia|iluvatar|metax|moore|cambricon] [OUTDIR]
    import json
    import sys

    print(json.dumps(build(*(sys.argv[1:3] or ["nvidia"])), indent=2))
