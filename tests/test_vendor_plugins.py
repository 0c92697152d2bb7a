"""The nvidia, iluvatar, metax, moore and cambricon plugins as installed: they import anywhere, say exactly why they
are unavailable without their SDK or device, never displace the cpu platform, and (where
the build machine has nvcc) carry the shared CUDA kernels compiled for sm_80/sm_90."""

import os
import shutil
from importlib import metadata
from pathlib import Path

import pytest

from uniccl._plugins import PluginManager

INSTALLED = {ep.name for ep in metadata.entry_points(group="uniccl.plugins")}


def _record(name, monkeypatch, **env):
    for key in (
        "CUDA_HOME",
        "CUDA_PATH",
        "NCCL_HOME",
        "COREX_HOME",
        "COREX_DIR",
        "MACA_PATH",
        "MUSA_HOME",
        "NEUWARE_HOME",
        "UNICCL_PLATFORM",
        "UNICCL_PLUGINS",
    ):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return {r.name: r for r in PluginManager().discover()}[name]


@pytest.mark.skipif("iluvatar" not in INSTALLED, reason="uniccl-iluvatar is not installed")
def test_iluvatar_unavailable_says_where_it_looked(monkeypatch, tmp_path):
    rec = _record("iluvatar", monkeypatch, COREX_HOME=str(tmp_path))
    if Path("/usr/local/corex").exists():
        pytest.skip("a CoreX SDK is installed here")
    assert rec.state == "unavailable"
    assert rec.reason.startswith("libcudart.so not found (searched: $COREX_HOME/lib64, $COREX_HOME/lib, ")
    assert "/usr/local/corex/lib64" in rec.reason


# plugin, its home variable (set to an empty folder, or None: unset), the SDK's default place,
# and the exact reason it must give
WHERE_IT_LOOKED = [
    (
        "metax",
        "MACA_PATH",
        "/opt/maca",
        "libmcruntime.so not found (searched: $MACA_PATH/lib, $MACA_PATH/lib64, /opt/maca/lib, /opt/maca/lib64)",
    ),
    (
        "moore",
        None,
        "/usr/local/musa",
        "libmusart.so not found (searched: $MUSA_HOME/lib (unset), $MUSA_HOME/lib64 (unset), /usr/local/musa/lib, "
        "/usr/local/musa/lib64)",
    ),
    (
        "cambricon",
        "NEUWARE_HOME",
        "/usr/local/neuware",
        "libcnrt.so not found (searched: $NEUWARE_HOME/lib64, $NEUWARE_HOME/lib, /usr/local/neuware/lib64)",
    ),
]


@pytest.mark.parametrize("name,home,sdk,reason", WHERE_IT_LOOKED)
def test_unavailable_says_where_it_looked(name, home, sdk, reason, monkeypatch, tmp_path):
    if name not in INSTALLED:
        pytest.skip(f"uniccl-{name} is not installed")
    rec = _record(name, monkeypatch, **({home: str(tmp_path)} if home else {}))
    if Path(sdk).exists():
        pytest.skip(f"an SDK is installed at {sdk}")
    assert rec.state == "unavailable" and rec.reason == reason
    assert rec.probe["kernels"].startswith("none: ")  # no vendor compiler here: BUILD_INFO says so


@pytest.mark.skipif("nvidia" not in INSTALLED, reason="uniccl-nvidia is not installed")
def test_nvidia_unavailable_with_the_exact_reason(monkeypatch, tmp_path):
    rec = _record("nvidia", monkeypatch, CUDA_HOME=str(tmp_path))
    if rec.state == "available":
        pytest.skip("an NVIDIA GPU is usable here")
    assert rec.state == "unavailable"
    # either no runtime at all, or a runtime that finds no driver/device: both named precisely
    assert rec.reason.startswith("libcudart.so.12 not found (searched: $CUDA_HOME/lib64, ") or rec.reason.startswith(
        "no NVIDIA CUDA device: cudaGetDeviceCount returned cudaError"
    ), rec.reason


@pytest.mark.skipif(
    not {"nvidia", "iluvatar", "metax", "moore", "cambricon"} & INSTALLED, reason="no vendor plugin installed"
)
def test_cpu_stays_the_platform(monkeypatch):
    import uniccl
    from uniccl._plugins import reset_manager

    for key in ("UNICCL_PLATFORM", "UNICCL_PLUGINS"):
        monkeypatch.delenv(key, raising=False)
    reset_manager()
    data = uniccl.info()
    reset_manager()
    usable = [p["name"] for p in data["plugins"] if p["state"] == "available" and p["name"] != "cpu"]
    if usable:
        pytest.skip(f"an accelerator platform is usable here: {usable}")
    assert data["chosen"]["platform"] == "cpu"


@pytest.mark.skipif("nvidia" not in INSTALLED, reason="uniccl-nvidia is not installed")
def test_nvidia_kernels_built_with_nvcc_where_nvcc_exists():
    import uniccl_nvidia

    info = (Path(uniccl_nvidia.__file__).parent / "_kernels" / "BUILD_INFO").read_text().strip()
    nvcc = shutil.which("nvcc") or (os.path.exists("/usr/local/cuda/bin/nvcc") and "/usr/local/cuda/bin/nvcc")
    if not nvcc and not Path(".venv-cuda/bin/nvcc").exists():
        assert info.startswith("none:"), info
        pytest.skip(f"no nvcc on this machine: {info}")
    assert info.startswith("nvcc "), info
    assert "sm_80" in info and "sm_90" in info and "PTX" in info, info
    libs = list((Path(uniccl_nvidia.__file__).parent / "_kernels").glob("*.so"))
    assert libs, "BUILD_INFO says built but no kernel library was installed"
