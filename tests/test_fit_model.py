"""The tuner's constants measured on the machine (issue 24, item 3): ``uniccl bench
--fit-model FILE`` fits alpha and beta to a real ping-pong and writes the table that
``UNICCL_TUNER_TABLE`` makes the tuner use."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from uniccl import InvalidArgument
from uniccl.comm import costmodel, tuner
from uniccl.tools.fit import least_squares


def test_the_fit_recovers_alpha_and_beta_of_exact_points():
    alpha, beta = 5e-6, 1e-9
    points = [(m, alpha + m * beta) for m in (8, 1024, 1 << 16, 1 << 22)]
    got = least_squares(points)
    assert got == pytest.approx((alpha, beta), rel=1e-9)


def test_the_fit_weighs_small_sizes_as_much_as_large_ones():
    rng = np.random.default_rng(3)
    alpha, beta = 12e-6, 1 / 8e9
    sizes = [8 << (2 * k) for k in range(11)]  # 8 B .. 8 MiB
    points = [(m, (alpha + m * beta) * (1 + 0.05 * rng.standard_normal())) for m in sizes]
    a, b = least_squares(points)
    assert a == pytest.approx(alpha, rel=0.1) and b == pytest.approx(beta, rel=0.1)


def test_the_tuner_takes_its_constants_from_the_table(tmp_path, monkeypatch):
    slow_messages = tmp_path / "slow.json"  # 1 ms a message: as few messages as possible
    costmodel.write_table(slow_messages, 1e-3, 1e-12, 1e-12)
    fast_messages = tmp_path / "fast.json"  # free messages, slow bytes: as few bytes as possible
    costmodel.write_table(fast_messages, 0.0, 1e-6, 1e-12)
    monkeypatch.delenv("UNICCL_ALGO", raising=False)
    picks = {}
    for name, path in (("slow", slow_messages), ("fast", fast_messages)):
        monkeypatch.setenv("UNICCL_TUNER_TABLE", str(path))
        t = tuner.Tuner(16, "tcp", shm_ready=False)
        choice = t.choose("all_reduce", 1 << 20)
        assert "UNICCL_TUNER_TABLE" in choice.why, choice
        picks[name] = choice.algorithm
    # 16 ranks, 1 MiB: recursive doubling sends 4 messages of 1 MiB, the ring 30 of 64 KiB
    assert picks == {"slow": "recursive_doubling", "fast": "ring"}
    # and the predictions are the formulas' with those constants
    table = costmodel.load_table(slow_messages)
    assert tuner.cost_all_reduce("ring", 1 << 20, 16, table) == costmodel.ring(1 << 20, 16, 1e-3, 1e-12, 1e-12)


def test_a_bad_table_is_a_typed_error_naming_the_variable(tmp_path, monkeypatch):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"alpha_s": -1, "beta_s_per_byte": 1e-9}))
    monkeypatch.setenv("UNICCL_TUNER_TABLE", str(bad))
    with pytest.raises(InvalidArgument) as err:
        tuner.Tuner(4, "tcp", shm_ready=False)
    assert "UNICCL_TUNER_TABLE" in str(err.value) and "alpha_s" in str(err.value)


def test_uniccl_bench_fit_model_writes_a_table_the_tuner_loads(tmp_path):
    out = tmp_path / "table.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("UNICCL_")}
    cmd = [sys.executable, "-m", "uniccl", "bench", "--fit-model", str(out), "-np", "2", "-b", "8", "-e", "1M"]
    cmd += ["-f", "8", "-n", "20", "-w", "2"]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    table = costmodel.load_table(out)
    notes = json.loads(out.read_text())
    assert table.alpha > 0 and table.beta > 0 and table.gamma and table.gamma > 0, notes
    assert sorted(map(int, notes["points_s"])) == [8, 64, 512, 4096, 32768, 262144], notes
    # the fit goes through the measured points within a factor of 3 (noisy machine, 2 cores)
    for m, t in notes["points_s"].items():
        assert 1 / 3 < (table.alpha + int(m) * table.beta) / t < 3, (m, t, table)
    assert "alpha" in res.stdout and str(out) in res.stdout
