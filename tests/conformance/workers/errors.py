"""A failing vendor call on one rank: that rank raises a typed error naming the call, the
others raise RemoteError naming that rank, nobody hangs, and the next call works.

usage: errors.py (under uniccl run, on an emulated platform: rank 1 injects
UNICCL_TEST_FAULT="<call>=<status>", a failure of the runtime's asynchronous copy
(cudaMemcpyAsync=700, cnrtMemcpyAsync_V2=632006 …), through the emulation's control
function)"""

import ctypes
import json
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _platform import DeviceArray

import uniccl

comm = uniccl.init()
r, n, be = comm.rank, comm.size, comm._backend
stream = be.stream_create(comm.device)
a = DeviceArray(be, np.full(1000, r + 1.0, np.float32), device=comm.device, stream=stream)
emu = be.record.module.runtime().lib  # the emulated runtime (opened RTLD_LOCAL: no global lookup)
emu.uniccl_emu_fail.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_int, ctypes.c_int]
call, status = os.environ["UNICCL_TEST_FAULT"].split("=")
if r == 1:  # the next asynchronous copy fails
    emu.uniccl_emu_fail(call.encode(), int(status), 0, 1)
row = {"rank": r}
try:
    comm.all_reduce(a.buffer())
    row["error"] = None
except uniccl.UnicclError as exc:
    row.update(
        error=type(exc).__name__,
        message=str(exc),
        call=getattr(exc, "call", None),
        code=getattr(exc, "code", None),
        remote_rank=getattr(exc, "remote_rank", None),
    )
a.upload(np.full(1000, r + 1.0, np.float32))
comm.all_reduce(a.buffer())  # the communicator still works, on every rank
row["after"] = bool(np.all(a.download() == n * (n + 1) / 2))
print(json.dumps(row), flush=True)
