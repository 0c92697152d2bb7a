"""The platform a conformance run checks, and how to reach it.

``cpu`` is the host plugin itself.  ``nvidia``, ``iluvatar``, ``metax``, ``moore`` and
``cambricon`` run against the ABI emulation (tests/emulation: libcudart and libnccl over
host memory, renamed to mc*/musa* and mccl* for MetaX and Moore, translated to CNRT and
CNCL for Cambricon) found through the vendor's own variables ($CUDA_HOME/$NCCL_HOME,
$COREX_HOME, $MACA_PATH, $MUSA_HOME, $NEUWARE_HOME), with the vendor's kernel source
compiled for the host (the shared CUDA-dialect kernels with host_compat.h; Cambricon's
BANG C with bang_host_compat.h): the plugins' binding layers run for real, the hardware
does not exist here.
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
BANG = ROOT / "plugins" / "cambricon" / "kernels"
EMULATED = {
    "nvidia": "UNICCL_NVIDIA_KERNELS",
    "iluvatar": "UNICCL_ILUVATAR_KERNELS",
    "metax": "UNICCL_METAX_KERNELS",
    "moore": "UNICCL_MOORE_KERNELS",
    "cambricon": "UNICCL_CAMBRICON_KERNELS",
}
#: symbol prefixes of each platform's runtime and collective library (names in errors, injection)
PREFIXES = {
    "nvidia": ("cuda", "nccl"),
    "iluvatar": ("cuda", "nccl"),
    "metax": ("mc", "mccl"),
    "moore": ("musa", "mccl"),
    "cambricon": ("cnrt", "cncl"),
}
#: a failing asynchronous copy, per platform: (call, status, status name)
COPY_FAULT = {name: (f"{rt}MemcpyAsync", 700, f"{rt}ErrorIllegalAddress") for name, (rt, _) in PREFIXES.items()}
COPY_FAULT["cambricon"] = ("cnrtMemcpyAsync_V2", 632006, "cnrtErrorDevice")
PLATFORMS = ("cpu", *EMULATED)
REAL: set = set()  # platforms checked on their real SDK and hardware (--uniccl-real), not emulated


@functools.cache
def host_kernels(platform: str = "nvidia") -> str:
    """The platform's kernel source compiled with g++ for the host (launches run as host
    loops): reduce.cu with host_compat.h, or Cambricon's reduce.mlu with bang_host_compat.h."""
    cxx = shutil.which("g++") or shutil.which("c++")
    if not cxx:
        pytest.skip("no g++ to build the host-compat kernels")
    from _emulation import _cache_root

    src, compat, name = (
        (BANG / "reduce.mlu", BANG / "bang_host_compat.h", "bang")
        if platform == "cambricon"
        else (KDIR / "reduce.cu", KDIR / "host_compat.h", "host")
    )
    out = _cache_root() / f"kernels-{name}" / f"libuniccl_kernels_{name}.so"
    out.parent.mkdir(parents=True, exist_ok=True)
    newest = max(f.stat().st_mtime for f in src.parent.iterdir() if f.suffix in (".cu", ".mlu", ".h"))
    if not out.exists() or out.stat().st_mtime < newest:
        tmp = out.with_suffix(f".{os.getpid()}.tmp")
        res = subprocess.run(
            [
                cxx,
                "-std=c++17",
                "-O2",
                "-fPIC",
                "-shared",
                "-x",
                "c++",
                "-include",
                str(compat),
                str(src),
                "-o",
                str(tmp),
            ],
            capture_output=True,
            text=True,
        )
        if res.returncode:
            raise RuntimeError(f"building the host-compat kernels failed:\n{res.stderr[-3000:]}")
        os.replace(tmp, out)
    return str(out)


@functools.cache
def platform_env(name: str) -> dict:
    """Environment variables that select ``name`` (and point it at the emulation)."""
    if name == "cpu" or name in REAL:
        return {"UNICCL_PLATFORM": name}
    if name not in EMULATED:
        pytest.fail(f"unknown platform {name!r}; conformance knows {', '.join(PLATFORMS)}")
    from _emulation import _cache_root, require

    emu = require(name)
    env = {
        "UNICCL_PLATFORM": name,
        emu["home_env"]: emu["root"],
        EMULATED[name]: host_kernels(name),
        "UNICCL_EMU_BUILD_DIR": str(_cache_root()),
        "UNICCL_EMU_TIMEOUT": "20",
    }
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
        cai = {
            "shape": self.shape,
            "typestr": self.dtype.str,
            "data": (self.ptr, False),
            "version": 3,
            "strides": None,
            "stream": self.stream,
        }
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
