"""uniccl platform plugin for Iluvatar CoreX GPUs.

CoreX ships a CUDA-compatible runtime (the same ``cuda*`` symbol names) and NCCL
under /usr/local/corex (or $COREX_HOME / $COREX_DIR).  Differences from CUDA are
handled in the kit: ``cudaStreamWaitEvent`` may report NotSupported, so the wait
happens on the host.  Pointers carry DLPack code 2 (CUDA) like NVIDIA's: CoreX's
own ``cudaPointerGetAttributes`` decides ownership.  Verified against the emulated
ABI only (tests/emulation); see docs/plugins.md.
"""

from __future__ import annotations

import glob
import os
import shutil

from uniccl.kit import CclSpec, CudaLikeSpec, DevicePlugin, LibrarySearch

__version__ = "0.1.0"

_HOMES = (("COREX_HOME", ("lib64", "lib")), ("COREX_DIR", ("lib64", "lib")))

RUNTIME = CudaLikeSpec(
    vendor="Iluvatar CoreX",
    prefix="cuda",
    search=LibrarySearch(
        names=("libcudart.so", "libcudart.so.10", "libcudart.so.10.2"),
        env=_HOMES,
        dirs=("/usr/local/corex/lib64", "/usr/local/corex/lib"),
        system=False,
    ),
)

NCCL = CclSpec(
    vendor="CoreX NCCL",
    prefix="nccl",
    search=LibrarySearch(
        names=("libnccl.so", "libnccl.so.2"),
        env=_HOMES,
        dirs=("/usr/local/corex/lib64", "/usr/local/corex/lib"),
        system=False,
    ),
)


def detect() -> str:
    """Evidence of Iluvatar hardware: its device nodes or its management tool."""
    if glob.glob("/dev/iluvatar*") or shutil.which("ixsmi"):
        return ""
    return "no /dev/iluvatar* and no ixsmi"


plugin = DevicePlugin(
    "iluvatar",
    __version__,
    RUNTIME,
    NCCL,
    priority=10,
    dlpack_types=(2, 3),
    kernels_dir=os.path.join(os.path.dirname(__file__), "_kernels"),
    kernels_env="UNICCL_ILUVATAR_KERNELS",
    detect=detect,
    description="Iluvatar CoreX GPUs: CoreX runtime and NCCL opened at run time, shared "
    "CUDA-dialect reduction kernels (clang -x ivcore)",
)
