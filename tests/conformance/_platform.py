"""The platform a conformance run checks, and how to reach it.

``cpu`` is the host plugin itself.  ``nvidia``, ``iluvatar``, ``metax`` and ``moore``
run against the ABI emulation (tests/emulation: libcudart and libnccl over host memory,
renamed to mc*/musa* and mccl* for MetaX and Moore) found through the vendor's own
variables ($CUDA_HOME/$NCCL_HOME, $COREX_HOME, $MACA_PATH, $MUSA_HOME), with
the shared CUDA-dialect kernels compiled for the host (host_compat.h): the
plugins' binding layers run for real, the hardware does not exist here.
"""
from __future__ import annotations

import ctypes
import functools
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

TESTS = Path(__file__).resolve().parents[1]
ROOT = TESTS.parent
KDIR = ROOT / "plugins" / "shared" / "cuda_kernels"
EMULATED = {"nvidia": "UNICCL_NVIDIA_KERNELS", "iluvatar": "UNICCL_ILUVATAR_KERNELS",
            "metax": "UNICCL_METAX_KERNELS", "moore": "UNICCL_MOORE_KERNELS"}
#: symbol prefixes of each platform's runtime and collective library (names in errors, injection)
PREFIXES = {"nvidia": ("cuda", "nccl"), "iluvatar": ("cuda", "nccl"), "metax": ("mc", "mccl"),
            "moore": ("musa", "mccl")}
PLATFORMS = ("cpu", *EMULATED)
REAL: set = set()  # platforms checked on their real SDK and hardware (--uniccl-real), not emulated


@functools.lru_cache(maxsize=None)
def host_kernels() -> str:
    """reduce.cu compiled with g++ and host_compat.h (launches run as host loops)."""
    cxx = shutil.which("g++") or shutil.which("c++")
    if not cxx:
        pytest.skip("no g++ to build the host-compat kernels")
    from _emulation import _cache_root

    out = _cache_root() / "kernels-host" / "libuniccl_kernels_host.so"
    out.parent.mkdir(parents=True, exist_ok=True)
    newest = max(f.stat().st_mtime for f in KDIR.iterdir() if f.suffix in (".cu", ".h"))
    if not out.exists() or out.stat().st_mtime < newest:
        tmp = out.with_suffix(f".{os.getpid()}.tmp")
        res = subprocess.run([cxx, "-std=c++17", "-O2", "-fPIC", "-shared", "-x", "c++", "-include",
                              str(KDIR / "host_compat.h"), str(KDIR / "reduce.cu"), "-o", str(tmp)],
                             capture_output=True, text=True)
        if res.returncode:
            raise RuntimeError(f"building the host-compat kernels failed:\n{res.stderr[-3000:]}")
        os.replace(tmp, out)
    return str(out)


@functools.lru_cache(maxsize=None)
def platform_env(name: str) -> dict:
    """Environment variables that select ``name`` (and point it at the emulation)."""
    if name == "cpu" or name in REAL:
        return {"UNICCL_PLATFORM": name}
    if name not in EMULATED:
        pytest.fail(f"unknown platform {name!r}; conformance knows {', '.join(PLATFORMS)}")
    from _emulation import _cache_root, require

    emu = require(name)
    env = {"UNICCL_PLATFORM": name, emu["home_env"]: emu["root"], EMULATED[name]: host_kernels(),
           "UNICCL_EMU_BUILD_DIR": str(_cache_root()), "UNICCL_EMU_TIMEOUT": "20"}
    if name == "nvidia":
        env["NCCL_HOME"] = emu["nccl_root"]
    return env


def apply(name: str) -> None:
    """Select ``name`` in this process (fresh plugin discovery)."""
    from uniccl._plugins import reset_manager

    os.environ.update(platform_env(name))
    reset_manager()


class DeviceArray:
    """An array in the platform's own memory, handed to uniccl as a device buffer
    (CUDA Array Interface for CUDA-like platforms; a numpy view on the cpu platform)."""

    def __init__(self, backend, data: np.ndarray, device: int = 0, stream=None):
        self.backend, self.device = backend, device
        self.shape, self.dtype = data.shape, data.dtype
        self.nbytes = data.nbytes
        self.ptr = backend.mem_alloc(device, max(1, self.nbytes)) if backend.mem_alloc else None
        self.stream = stream
        self.upload(data)

    @property
    def __cuda_array_interface__(self):
        if self.backend.name == "cpu":
            raise AttributeError("__cuda_array_interface__")  # host memory: use the buffer protocol
        cai = {"shape": self.shape, "typestr": self.dtype.str, "data": (self.ptr, False), "version": 3,
               "strides": None, "stream": self.stream}
        if self.dtype.name == "bfloat16":  # no typestr of its own: the interface's descr names it
            cai["descr"] = [("bfloat16", self.dtype.str)]
        return cai

    def __array__(self, dtype=None, copy=None):
        return self.download()

    def view(self) -> np.ndarray:
        """cpu platform: the memory itself as a numpy array (what uniccl receives)."""
        buf = (ctypes.c_char * self.nbytes).from_address(self.ptr)
        return np.frombuffer(buf, dtype=self.dtype).reshape(self.shape)

    def upload(self, data: np.ndarray) -> None:
        src = np.ascontiguousarray(data, dtype=self.dtype)
        if self.nbytes:
            self.backend.memcpy(self.ptr, src.ctypes.data, self.nbytes, 1, None)  # host to device

    def download(self) -> np.ndarray:
        out = np.empty(self.shape, self.dtype)
        if self.nbytes:
            self.backend.memcpy(out.ctypes.data, self.ptr, self.nbytes, 2, None)  # device to host
        return out

    def free(self) -> None:
        if self.ptr is not None:
            self.backend.mem_free(self.device, self.ptr)
            self.ptr = None

    def buffer(self):
        """What to pass to a collective."""
        return self.view() if self.backend.name == "cpu" else self


def python() -> str:
    return sys.executable
