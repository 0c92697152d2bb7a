"""MetaX's and Moore's collective libraries are both libmccl with mccl* symbols: once one
plugin has loaded its MCCL in a process, the other's native collectives are unavailable
with the reason, and it stages through host memory instead (tests/emulation kinds metax, moore)."""

from importlib import metadata

import _emulation
import pytest

from uniccl.kit import DevicePlugin, _dl

INSTALLED = {ep.name for ep in metadata.entry_points(group="uniccl.plugins")}
REASON = "MetaX and Moore MCCL share symbol names"


@pytest.fixture
def registry(monkeypatch):
    """A fresh record of the collective libraries loaded in this process."""
    fresh = {}
    monkeypatch.setattr(_dl, "LOADED_CCLS", fresh)
    return fresh


def test_conflict_rule(registry):
    assert _dl.ccl_conflict("mccl", "moore", REASON) == ""  # nothing loaded yet
    _dl.note_ccl("mccl", "metax", "/opt/maca/lib/libmccl.so")
    _dl.note_ccl("mccl", "moore", "/usr/local/musa/lib/libmccl.so")  # the first loader stays recorded
    assert registry == {"mccl": ("metax", "/opt/maca/lib/libmccl.so")}
    assert (
        _dl.ccl_conflict("mccl", "moore", REASON)
        == "libmccl of metax already loaded in this process: MetaX and Moore MCCL share symbol names"
    )
    assert _dl.ccl_conflict("mccl", "metax", REASON) == ""  # its own library
    # NCCL-class libraries that are not exclusive (NVIDIA's and CoreX's libnccl) may share a process
    _dl.note_ccl("nccl", "nvidia", "/usr/local/cuda/lib64/libnccl.so.2")
    assert _dl.ccl_conflict("nccl", "iluvatar", "") == ""


def _fresh(name):
    """A new, unprobed instance of the installed plugin ``name`` (same specs)."""
    module = pytest.importorskip(f"uniccl_{name}")
    return DevicePlugin(name, module.__version__, module.RUNTIME, module.MCCL, priority=10)


@pytest.mark.skipif(not {"metax", "moore"} <= INSTALLED, reason="uniccl-metax and uniccl-moore are not installed")
@pytest.mark.parametrize("first,second", [("metax", "moore"), ("moore", "metax")])
def test_second_mccl_is_refused_with_the_reason(registry, monkeypatch, first, second):
    for kind in ("metax", "moore"):
        info = _emulation.require(kind)
        monkeypatch.setenv(info["home_env"], info["root"])
    monkeypatch.delenv("UNICCL_PLUGINS", raising=False)
    a, b = _fresh(first), _fresh(second)
    ccl, why = a.ccl()
    assert ccl is not None and why == "" and ccl.path.endswith("/libmccl.so"), why
    assert registry == {"mccl": (first, ccl.path)}
    assert a.uniccl_native_collectives() is not None

    reason = f"libmccl of {first} already loaded in this process: MetaX and Moore MCCL share symbol names"
    assert b.ccl() == (None, reason)
    probe = b.uniccl_probe()
    assert probe["available"], probe  # the runtime is still usable: staged collectives
    assert probe["versions"]["mccl"] == f"unavailable: {reason}"
    assert b.uniccl_native_collectives() is None
    assert registry == {"mccl": (first, ccl.path)}
