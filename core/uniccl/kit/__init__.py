"""The vendor plugin kit: what every accelerator plugin shares.

A CUDA-like plugin (CUDA, CoreX, MACA, MUSA) is a :class:`CudaLikeSpec` (symbol
prefix, library names and places, status names, enum values), an optional
:class:`CclSpec` for its collective library, and :class:`DevicePlugin`, which
implements every uniccl hook from them.  A runtime of another shape (Cambricon's
CNRT) brings specs whose ``load()`` binds it in the same shape.  Vendor libraries are opened at run time
(:func:`find_library`), never linked; every vendor status goes through
:func:`check_status`.  See docs/plugins.md.
"""

from __future__ import annotations

from ._ccl import NCCL_STATUS, CclLibrary, CclSpec
from ._cudalike import CUDA_STATUS, CudaLikeRuntime, CudaLikeSpec
from ._dl import LibrarySearch, find_library, load_library
from ._plugin import DevicePlugin
from ._runtime import DeviceRuntime
from ._status import check_status, renamed

__all__ = [
    "CUDA_STATUS",
    "NCCL_STATUS",
    "CclLibrary",
    "CclSpec",
    "DevicePlugin",
    "DeviceRuntime",
    "CudaLikeRuntime",
    "CudaLikeSpec",
    "LibrarySearch",
    "check_status",
    "find_library",
    "load_library",
    "renamed",
]
