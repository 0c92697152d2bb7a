"""``comm.revoke`` on the native path (an emulated platform with a vendor library): rank 0
revokes while rank 1 is in no call; rank 1's vendor communicator is aborted by the TCP reader
that hears the notice (a vendor call waiting for the revoker would never end otherwise), its
next call raises Revoked, and shrink() gives a communicator whose device-buffer all_reduce runs
through the vendor library again (checked against numpy, float64).

usage: revoke.py  (under uniccl run, 2 ranks).  Prints one JSON line per rank."""

import ctypes
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _platform import DeviceArray

import uniccl

comm = uniccl.init()
r, n, be = comm.rank, comm.size, comm._backend
lib = be.record.module.runtime().lib  # the emulation's call counters
lib.uniccl_emu_calls.argtypes, lib.uniccl_emu_calls.restype = [ctypes.c_char_p], ctypes.c_int
prefix = be.record.module.ccl_spec.prefix.encode()
aborts = lambda: sum(lib.uniccl_emu_calls(name) for name in (prefix + b"CommAbort", prefix + b"AbortComm"))  # noqa: E731
calls = lambda: lib.uniccl_emu_calls(prefix + b"AllReduce")  # noqa: E731
vals = np.arange(64, dtype=np.float32) + r
a = DeviceArray(be, vals, device=comm.device)
before = calls()
comm.all_reduce(a)
row = {"rank": r, "native": comm._native_comm is not None, "library_ran": calls() > before}
row["sum_ok"] = bool(np.array_equal(a.download(), sum(np.arange(64, dtype=np.float64) + q for q in range(n))))
aborted_before = aborts()  # (before the barrier: rank 0's revoke may reach rank 1 right after it)
comm.barrier()
if r == 0:
    comm.revoke("lost a GPU")
else:
    deadline = time.monotonic() + 10.0  # no call runs here: the reader thread aborts (ms; 10 s: loaded CI)
    while comm._native_comm is not None and time.monotonic() < deadline:
        time.sleep(0.005)
row.update(vendor_aborted=aborts() - aborted_before, native_after=comm._native_comm is not None)
try:
    comm.all_reduce(a)
    row["revoked"] = "returned"
except uniccl.Revoked as exc:
    row["revoked"] = str(exc)
new = comm.shrink()
b = DeviceArray(be, np.full(32, r + 1.0, np.float32), device=new.device)
before = calls()
new.all_reduce(b)
row.update(
    shrunk_native=new._native_comm is not None,
    shrunk_library_ran=calls() > before,
    shrunk_ok=bool(np.array_equal(b.download(), np.full(32, n * (n + 1) / 2))),
)
new.destroy()
comm.destroy()
print(json.dumps(row), flush=True)
