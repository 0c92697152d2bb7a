"""uniccl platform plugin for MetaX GPUs (MACA).

MACA's runtime ``libmcruntime`` exports the CUDA runtime's shapes under the ``mc``
prefix (``mcMalloc``, ``mcMemcpyAsync``, ``mcStreamCreate`` …) and MCCL
(``libmccl``) NCCL's under ``mccl``; both live in $MACA_PATH (default /opt/maca).
Status codes and memcpy kinds follow CUDA's numbering (mcErrorNotReady 600,
mcErrorIllegalAddress 700, mcMemcpyHostToDevice 1 …), as a public binding of
``mcr/maca.h`` gives them; no MetaX header was seen.  Targets MACA 3.3–3.8 with
MCCL 2.16.5.  Moore Threads' MCCL is also
``libmccl`` with ``mccl*`` symbols: the two are never loaded into one process (the
second plugin's native collectives say why).  Verified against the emulated ABI only
(tests/emulation); see docs/plugins.md.
"""

from __future__ import annotations

import glob
import os

from uniccl.kit import CUDA_STATUS, NCCL_STATUS, CclSpec, CudaLikeSpec, DevicePlugin, LibrarySearch, renamed

__version__ = "0.1.0"

_HOMES = (("MACA_PATH", ("lib", "lib64")),)
_DIRS = ("/opt/maca/lib", "/opt/maca/lib64")

RUNTIME = CudaLikeSpec(
    vendor="MetaX MACA",
    prefix="mc",
    search=LibrarySearch(names=("libmcruntime.so",), env=_HOMES, dirs=_DIRS, system=False),
    statuses=renamed(CUDA_STATUS, "cuda", "mc"),
    props_symbol="GetDeviceProperties",  # no _v2 entry point in MACA
)

MCCL = CclSpec(
    vendor="MetaX MCCL",
    prefix="mccl",
    search=LibrarySearch(names=("libmccl.so",), env=_HOMES, dirs=_DIRS, system=False),
    statuses=renamed(NCCL_STATUS, "nccl", "mccl"),
    exclusive="MetaX and Moore MCCL share symbol names",
)


def detect() -> str:
    """Evidence of MetaX hardware: MACA_PATH set or a PCI device of vendor 0x9999."""
    if os.environ.get("MACA_PATH"):
        return ""
    for path in glob.glob("/sys/bus/pci/devices/*/vendor"):
        try:
            with open(path) as f:
                if f.read().strip().lower() == "0x9999":
                    return ""
        except OSError:
            continue
    return "MACA_PATH unset and no PCI device of vendor 0x9999"


plugin = DevicePlugin(
    "metax",
    __version__,
    RUNTIME,
    MCCL,
    priority=10,
    dlpack_types=(2, 3),
    kernels_dir=os.path.join(os.path.dirname(__file__), "_kernels"),
    kernels_env="UNICCL_METAX_KERNELS",
    detect=detect,
    description="MetaX GPUs: MACA runtime (mc*) and MCCL opened at run time, shared "
    "CUDA-dialect reduction kernels (mxcc -x maca)",
)
