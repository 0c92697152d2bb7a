"""Error paths through the platform: vendor failures become typed errors on the calling
rank and RemoteError on the others (never a hang); bad buffers are named."""

import json
import os
import subprocess
import sys
from pathlib import Path

import _platform
import numpy as np
import pytest
from _platform import DeviceArray

WORKER = str(Path(__file__).parent / "workers" / "errors.py")


@pytest.mark.parametrize("n", [2, 3])
def test_failing_copy_is_typed_and_nobody_hangs(platform, rank_env, n):
    if platform not in _platform.EMULATED or platform in _platform.REAL:
        pytest.skip("failure injection needs the emulated vendor runtime")
    cmd = [sys.executable, "-m", "uniccl", "run", "--no-prefix", "-n", str(n), "--timeout", "60", WORKER]
    # host staging copies with cudaMemcpyAsync (mcMemcpyAsync, cnrtMemcpyAsync_V2 …) on the
    # buffer's stream (the native path copies nothing)
    call, code, name = _platform.COPY_FAULT[platform]
    env = dict(os.environ, **rank_env, UNICCL_PLUGINS="^nccl", UNICCL_TEST_FAULT=f"{call}={code}")
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=90, env=env)
    rows = sorted((json.loads(x) for x in res.stdout.splitlines() if x.startswith("{")), key=lambda x: x["rank"])
    assert res.returncode == 0 and len(rows) == n, res.stdout[-2000:] + res.stderr[-2000:]
    for row in rows:
        assert row["after"], row
        if row["rank"] == 1:
            assert row["error"] == "VendorError" and row["call"] == call and row["code"] == code, row
            assert name in row["message"] and "[all_reduce, rank 1]" in row["message"], row
        else:
            assert row["error"] == "RemoteError" and row["remote_rank"] == 1, row


def test_foreign_pointer_is_rejected_by_name(backend):
    """Memory the platform does not own, presented as its device memory, is refused up front."""
    import uniccl

    class Fake:
        __cuda_array_interface__ = {
            "shape": (4,),
            "typestr": "<f4",
            "data": (np.zeros(4).ctypes.data, False),
            "version": 3,
        }

    if backend.name == "cpu":
        pytest.skip("the cpu platform owns no CUDA-interface memory")
    with uniccl.Communicator._over(_single(), backend.name) as comm:
        with pytest.raises(uniccl.InvalidArgument, match="sendbuf") as info:
            comm.all_reduce(Fake())
        assert info.value.rank == 0 and info.value.op == "all_reduce"


def _single():
    """A one-rank TCP transport (no MPI, no launcher)."""
    from uniccl.bootstrap.rendezvous import get_unique_id
    from uniccl.transport.tcp import Mesh, TCPTransport, derive_context

    uid = get_unique_id(30)
    return TCPTransport(Mesh(uid, 0, 1, 30), [0], derive_context(7, 0, 0))


def test_device_array_helper_round_trip(backend):
    a = DeviceArray(backend, np.arange(10.0))
    try:
        assert np.array_equal(a.download(), np.arange(10.0))
    finally:
        a.free()
