"""uniccl platform plugin for Cambricon MLUs (Neuware: CNRT, CNCL, BANG C).

CNRT (``libcnrt``) is not CUDA-shaped enough for the kit's CUDA-like template, so
this plugin brings its own bindings of the same shape (``_cnrt``: queues, notifiers,
``cnrtMemcpyAsync_V2`` directions, ``cnrtErrorBusy``; ``_cncl``: clique ids,
``cnclInitComms``) and the kit's DevicePlugin implements every uniccl hook over
them.  Reduction kernels are BANG C (``kernels/reduce.mlu``) compiled by cncc when
Neuware is present at build time.  Libraries are found through $NEUWARE_HOME
(default /usr/local/neuware, libraries in lib64).  Verified against the emulated
ABI only (tests/emulation: cnrt_emu.c, cncl_emu.c); see docs/plugins.md.
"""

from __future__ import annotations

import glob
import os
import shutil

from uniccl.kit import DevicePlugin, LibrarySearch

from ._cncl import CnclSpec
from ._cnrt import CnrtSpec

__version__ = "0.1.0"

_HOMES = (("NEUWARE_HOME", ("lib64", "lib")),)
_DIRS = ("/usr/local/neuware/lib64",)

RUNTIME = CnrtSpec(
    vendor="Cambricon CNRT", search=LibrarySearch(names=("libcnrt.so",), env=_HOMES, dirs=_DIRS, system=False)
)
CNCL = CnclSpec(
    vendor="Cambricon CNCL",
    search=LibrarySearch(names=("libcncl.so", "libcncl.so.1"), env=_HOMES, dirs=_DIRS, system=False),
)


def detect() -> str:
    """Evidence of Cambricon hardware: NEUWARE_HOME set, an MLU device node, or cnmon."""
    if os.environ.get("NEUWARE_HOME") or glob.glob("/dev/cambricon_dev*") or shutil.which("cnmon"):
        return ""
    return "NEUWARE_HOME unset, no /dev/cambricon_dev* and no cnmon on PATH"


plugin = DevicePlugin(
    "cambricon",
    __version__,
    RUNTIME,
    CNCL,
    priority=10,
    # the CUDA Array Interface (2; it names no vendor) and ExtDev (12: PyTorch's PrivateUse1, which
    # torch_mlu's "mlu" device is); every pointer is confirmed with cnrtPointerGetAttributes
    dlpack_types=(2, 12),
    kernels_dir=os.path.join(os.path.dirname(__file__), "_kernels"),
    kernels_env="UNICCL_CAMBRICON_KERNELS",
    kernels_prefix="uniccl_bang",
    detect=detect,
    description="Cambricon MLUs: CNRT and CNCL opened at run time, BANG C reduction kernels (cncc)",
)
