"""uniccl platform plugin for Moore Threads GPUs (MUSA).

MUSA's runtime ``libmusart`` exports the CUDA runtime's shapes under the ``musa``
prefix (``musaMalloc``, ``musaMemcpyAsync`` …) with CUDA's status numbering (MUSA's
``musaError`` enum: musaErrorNotReady 600, musaErrorIllegalAddress 700 …); Moore's
MCCL (``libmccl``) has NCCL's shapes under ``mccl``.  Both live in $MUSA_HOME (default
/usr/local/musa).  MetaX's MCCL is also ``libmccl`` with ``mccl*`` symbols: the two are
never loaded into one process (the second plugin's native collectives say why).
Verified against the emulated ABI only (tests/emulation); see docs/plugins.md.
"""

from __future__ import annotations

import glob
import os
import shutil

from uniccl.kit import CUDA_STATUS, NCCL_STATUS, CclSpec, CudaLikeSpec, DevicePlugin, LibrarySearch, renamed

__version__ = "0.1.0"

_HOMES = (("MUSA_HOME", ("lib", "lib64")),)
_DIRS = ("/usr/local/musa/lib", "/usr/local/musa/lib64")

RUNTIME = CudaLikeSpec(
    vendor="Moore Threads MUSA",
    prefix="musa",
    search=LibrarySearch(names=("libmusart.so",), env=_HOMES, dirs=_DIRS, system=False),
    statuses=renamed(CUDA_STATUS, "cuda", "musa"),
    props_symbol="GetDeviceProperties",
)

MCCL = CclSpec(
    vendor="Moore Threads MCCL",
    prefix="mccl",
    search=LibrarySearch(names=("libmccl.so",), env=_HOMES, dirs=_DIRS, system=False),
    statuses=renamed(NCCL_STATUS, "nccl", "mccl"),
    exclusive="MetaX and Moore MCCL share symbol names",
)


def detect() -> str:
    """Evidence of Moore Threads hardware: its device nodes or its management tool."""
    if glob.glob("/dev/mtgpu*") or shutil.which("mthreads-gmi"):
        return ""
    return "no /dev/mtgpu* and no mthreads-gmi"


plugin = DevicePlugin(
    # DLPack: CUDA codes as the CUDA Array Interface gives them, and ExtDev (12), which PyTorch's
    # PrivateUse1 devices (torch_musa) export; the runtime's pointer query decides ownership
    "moore",
    __version__,
    RUNTIME,
    MCCL,
    priority=10,
    dlpack_types=(2, 3, 12),
    kernels_dir=os.path.join(os.path.dirname(__file__), "_kernels"),
    kernels_env="UNICCL_MOORE_KERNELS",
    detect=detect,
    description="Moore Threads GPUs: MUSA runtime (musa*) and MCCL opened at run time, shared "
    "CUDA-dialect reduction kernels (mcc -x musa)",
)
