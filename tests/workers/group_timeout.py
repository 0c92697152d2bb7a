"""A recv inside ``uniccl.group()`` whose peer never sends obeys its ``timeout=`` (under
``uniccl run``).  Rank 0 prints one JSON line: the error's type, message and the seconds it took."""

import json
import sys
import time

import numpy as np

import uniccl

limit = float(sys.argv[1])
with uniccl.init() as comm:
    if comm.rank == 0:
        t0 = time.monotonic()
        err = None
        try:
            with uniccl.group():
                comm.recv(np.empty(4), 1, timeout=limit)
        except uniccl.UnicclError as exc:
            err = exc
        print(
            json.dumps({"type": type(err).__name__, "message": str(err), "seconds": time.monotonic() - t0}), flush=True
        )
    else:
        time.sleep(limit + 8)  # alive, never sending
