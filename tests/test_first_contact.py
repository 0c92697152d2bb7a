"""First contact, the way a new user starts a job: a real ``torchrun`` with backend "uniccl"
(compared with the same job on gloo), and plain ``python`` processes joining one unique id.
Neither sets any UNICCL_* variable: the environment is scrubbed of them."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from _launch import WORKERS, rank_counts

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def user_env() -> dict:
    """This environment as a user's shell has it: no UNICCL_* variable at all."""
    return {k: v for k, v in os.environ.items() if not k.startswith("UNICCL_")} | {"PYTHONWARNINGS": "ignore"}


def run(cmd, timeout=300):
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=user_env(), cwd=ROOT)
    assert res.returncode == 0, (
        f"{' '.join(map(str, cmd))} exited {res.returncode}:\n{res.stdout[-3000:]}\n{res.stderr[-4000:]}"
    )
    return res


@pytest.mark.parametrize("n", rank_counts([2, 4]))
def test_torchrun_ddp_on_uniccl_ends_where_gloo_does(n, tmp_path):
    torch = pytest.importorskip("torch")
    torchrun = BIN / "torchrun"
    assert torchrun.exists(), "torch's torchrun is not next to this interpreter"
    for backend in ("gloo", "uniccl"):
        res = run(
            [
                str(torchrun),
                "--standalone",
                "--nproc-per-node",
                str(n),
                "examples/torch/ddp.py",
                "--backend",
                backend,
                "--out",
                str(tmp_path / backend),
            ]
        )
        for r in range(n):
            assert f"rank {r}/{n} backend {backend}: 20 steps" in res.stdout, res.stdout
    gloo = torch.load(tmp_path / "gloo-0.pt")
    torch.manual_seed(1234)  # the first layer as rank 0 started it (same seed, made first)
    start = torch.nn.Linear(16, 32).to(torch.float64)
    for r in range(n):
        ours = torch.load(tmp_path / f"uniccl-{r}.pt")
        for a, b in zip(ours["torch.float64"], gloo["torch.float64"]):
            assert torch.equal(a, b), (r, (a - b).abs().max())  # bitwise: gloo's order of terms
        for a, b in zip(ours["torch.float32"], gloo["torch.float32"]):
            assert torch.allclose(a, b, rtol=1e-5, atol=1e-6)
        assert not torch.allclose(ours["torch.float64"][0], start.weight, atol=1e-3)  # training moved it


@pytest.mark.parametrize("n,timeout", [(n, None) for n in rank_counts([2, 3])] + [(n, 0) for n in rank_counts([2])])
def test_plain_processes_join_one_unique_id(n, timeout, tmp_path):
    """timeout=0 is no limit (it failed at once in the set-up's waits)."""
    uid_file = tmp_path / "uid"
    extra = [] if timeout is None else [str(timeout)]
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                str(WORKERS / "uid_plain.py"),
                str(r),
                str(n),
                str(uid_file),
                str(tmp_path / f"out-{r}.json"),
                *extra,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=user_env(),
        )
        for r in range(n)
    ]
    try:
        outs = [p.communicate(timeout=180)[0] for p in procs]
    finally:
        for p in procs:
            p.kill()
    for r, (p, out) in enumerate(zip(procs, outs)):
        assert p.returncode == 0, f"rank {r} exited {p.returncode}:\n{out[-4000:]}"
    for r in range(n):
        got = json.loads((tmp_path / f"out-{r}.json").read_text())
        assert (got["rank"], got["size"]) == (r, n)
        assert got["timeout"] == (120.0 if timeout is None else timeout)
        assert got["transport"] in ("shm", "tcp"), got["transport"]  # never MPI: no MPI job here
        np.testing.assert_array_equal(got["all_reduce"], np.arange(1000, dtype=np.float64) * sum(range(1, n + 1)))
        assert got["broadcast"] == [n - 1] * 7
        assert got["all_gather"] == [10 * q + j for q in range(n) for j in range(3)]


@pytest.mark.parametrize("n", rank_counts([2]))
def test_uniccl_init_under_torchrun_is_torchruns_world(n, tmp_path):
    pytest.importorskip("torch")
    run(
        [
            str(BIN / "torchrun"),
            "--standalone",
            "--nproc-per-node",
            str(n),
            str(WORKERS / "torchrun_init.py"),
            str(tmp_path / "out"),
        ]
    )
    rows = [json.loads((tmp_path / f"out-{r}.json").read_text()) for r in range(n)]
    assert [r["rank"] for r in rows] == list(range(n)), rows
    for r in rows:
        assert r["size"] == n and r["local"] == [r["rank"], n]
        np.testing.assert_array_equal(r["all_reduce"], n * np.arange(64, dtype=np.float64) + sum(range(n)))
        assert r["all_gather"] == [7 * q for q in range(n)]
