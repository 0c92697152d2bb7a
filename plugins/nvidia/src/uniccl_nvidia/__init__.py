"""uniccl platform plugin for NVIDIA GPUs.

Everything vendor-specific is the two specs below: where libcudart and libnccl
live and what CUDA calls things.  The kit (``uniccl.kit``) does the rest.
Verified against the emulated ABI (tests/emulation); see docs/plugins.md for
what has run on real hardware.
"""

from __future__ import annotations

import os

from uniccl.kit import CclSpec, CudaLikeSpec, DevicePlugin, LibrarySearch

__version__ = "0.1.0"

RUNTIME = CudaLikeSpec(
    vendor="NVIDIA CUDA",
    prefix="cuda",
    search=LibrarySearch(
        names=("libcudart.so.12", "libcudart.so.13", "libcudart.so"),
        env=(("CUDA_HOME", ("lib64", "lib")), ("CUDA_PATH", ("lib64", "lib"))),
        dirs=("/usr/local/cuda/lib64",),
        wheels=(("nvidia.cuda_runtime", "lib"), ("nvidia.cu13", "lib")),
    ),
)

NCCL = CclSpec(
    vendor="NCCL",
    prefix="nccl",
    search=LibrarySearch(
        names=("libnccl.so.2", "libnccl.so"),
        env=(("NCCL_HOME", ("lib", "lib64")), ("CUDA_HOME", ("lib64", "lib"))),
        dirs=("/usr/local/nccl/lib",),
        wheels=(("nvidia.nccl", "lib"), ("nvidia.cu13", "lib"), ("nvidia.cu12", "lib")),
    ),
)

plugin = DevicePlugin(
    "nvidia",
    __version__,
    RUNTIME,
    NCCL,
    priority=10,
    dlpack_types=(2, 3),
    kernels_dir=os.path.join(os.path.dirname(__file__), "_kernels"),
    kernels_env="UNICCL_NVIDIA_KERNELS",
    description="NVIDIA GPUs: CUDA runtime and NCCL opened at run time, shared CUDA reduction kernels",
)
