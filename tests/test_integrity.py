"""Payload integrity: CRC-32C (the core's C implementation); over TCP, checksummed messages
with retransmission of corrupted ones; on shared memory (UNICCL_SHM_CHECKSUM=1), checked
regions copied again.  Injected bit flips and drops leave results bitwise equal to a clean
run; data that stays corrupted is a typed error on every rank, not garbage or a hang."""

import json
import os
import subprocess
import sys
import zlib

import numpy as np
from _launch import WORKERS

from uniccl.transport.shm._shm import crc32c, crc32c_at

WORKER = str(WORKERS / "integrity.py")


def test_crc32c_known_values_and_continuation():
    assert crc32c(b"123456789") == 0xE3069283  # the standard check value of CRC-32C
    assert crc32c(b"") == 0 and crc32c(b"123456789") != zlib.crc32(b"123456789")
    data = np.random.default_rng(0).integers(0, 256, 1 << 20, dtype=np.uint8)
    whole = crc32c(data)
    assert crc32c(data[777:], crc32c(data[:777])) == whole  # continuing a checksum
    assert crc32c_at(data.ctypes.data, data.nbytes) == whole
    flipped = data.copy()
    flipped[12345] ^= 4
    assert crc32c(flipped) != whole


def run(nbytes, inject, ranks=3):
    env = dict(os.environ, UNICCL_TRANSPORT="tcp", UNICCL_TEST_INJECT=inject)
    res = subprocess.run(
        [sys.executable, "-m", "uniccl", "run", "--no-prefix", "-n", str(ranks), WORKER, str(nbytes)],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
    )
    rows = [json.loads(x) for x in res.stdout.splitlines() if x.startswith("{")]
    assert len(rows) == ranks, res.stdout[-3000:] + res.stderr[-3000:]
    return sorted(rows, key=lambda r: r["rank"])


def test_bit_flips_in_a_256_mib_all_reduce_are_retransmitted():
    """1 flip per 1000 messages (seeded: the same messages every run) over 256 MiB per rank."""
    rows = run(256 << 20, "flip=0.001,seed=1")
    assert all(r.get("equal") for r in rows), rows
    assert sum(r["injected"]["flip"] for r in rows) > 0
    assert sum(r["checksum_failures"] for r in rows) == sum(r["injected"]["flip"] for r in rows)
    assert sum(r["retransmits"] for r in rows) == sum(r["retransmit_requests"] for r in rows) > 0


def test_drops_and_delays_are_recovered():
    rows = run(1 << 20, "drop=0.05,delay=0.05:0.02,flip=0.05,seed=4")
    assert all(r.get("equal") for r in rows), rows
    assert sum(r["injected"]["drop"] + r["injected"]["flip"] for r in rows) > 0
    assert sum(r["retransmits"] for r in rows) > 0


def test_a_message_that_stays_corrupted_is_a_typed_error_everywhere():
    rows = run(1 << 20, "flip=1,seed=2")  # every copy arrives corrupted
    for r in rows:
        assert r.get("error") in ("InternalError", "RemoteError"), r
    culprits = [r for r in rows if r["error"] == "InternalError"]
    assert culprits and all("arrived corrupted and failed its checksum" in r["message"] for r in culprits), rows


def test_checksums_can_be_turned_off(monkeypatch):
    monkeypatch.setenv("UNICCL_TCP_CHECKSUM", "0")
    from uniccl.transport.tcp import _checksums

    assert _checksums()[0] is False


SHM_WORKER = str(WORKERS / "integrity_shm.py")


def run_shm(mode, ranks=3, **env):
    full = dict(os.environ, UNICCL_TRANSPORT="shm", **env)
    res = subprocess.run(
        [sys.executable, "-m", "uniccl", "run", "--no-prefix", "-n", str(ranks), SHM_WORKER, mode],
        capture_output=True,
        text=True,
        timeout=240,
        env=full,
    )
    rows = [json.loads(x) for x in res.stdout.splitlines() if x.startswith("{")]
    assert len(rows) == ranks, res.stdout[-3000:] + res.stderr[-3000:]
    return sorted(rows, key=lambda r: r["rank"])


def test_shm_checksums_keep_every_collective_exact_under_bit_flips():
    clean = run_shm("all")
    assert not any(r["shm_checksums"] for r in clean)  # off by default (the cost: docs/reliability.md)
    flipped = run_shm("all", UNICCL_SHM_CHECKSUM="1", UNICCL_FAULT_INJECT="shm_flip=0.05")
    assert [r["hash"] for r in flipped] == [r["hash"] for r in clean]
    assert all(r["shm_checksums"] for r in flipped)
    assert sum(r["shm_recopies"] for r in flipped) == sum(r["shm_checksum_failures"] for r in flipped) > 0


def test_shm_bit_flips_in_a_256_mib_all_reduce():
    """1 flip per 1000 copies out of the slots; the result equals the clean run's."""
    clean = run_shm("big")
    flipped = run_shm("big", UNICCL_SHM_CHECKSUM="1", UNICCL_FAULT_INJECT="shm_flip=0.001")
    assert [r["hash"] for r in flipped] == [r["hash"] for r in clean]
    assert sum(r["shm_recopies"] for r in flipped) > 0


def test_shm_region_that_stays_corrupted_is_a_typed_error_everywhere():
    rows = run_shm("all", UNICCL_SHM_CHECKSUM="1", UNICCL_FAULT_INJECT="shm_flip=1")
    for r in rows:
        assert r.get("error") in ("InternalError", "RemoteError"), r
    assert any(r["error"] == "InternalError" and "failed its CRC-32C check" in r["message"] for r in rows), rows
