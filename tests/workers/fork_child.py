"""A forked child (a DataLoader worker) must never touch its parent's communicator (under
``uniccl run``): in the child every call on the inherited communicator, abort and destroy
included, is InvalidUsage; the child then exits through Python (atexit handlers run).  The
parent, meanwhile and after, keeps computing with its peers.  Prints one JSON line per rank."""

import json
import os
import sys

import numpy as np

import uniccl

with uniccl.init() as comm:
    x = np.ones(1 << 16)
    comm.all_reduce(x)
    pid = os.fork()
    if pid == 0:  # the child
        said = {}
        for name, call in (
            ("all_reduce", lambda: comm.all_reduce(np.ones(4))),
            ("abort", comm.abort),
            ("destroy", comm.destroy),
            ("barrier", comm.barrier),
        ):
            try:
                call()
                said[name] = "returned"
            except uniccl.InvalidUsage as exc:
                said[name] = "InvalidUsage" if "forked child" in str(exc) else f"InvalidUsage: {exc}"
            except BaseException as exc:
                said[name] = f"{type(exc).__name__}: {exc}"
        with open(sys.argv[1] + f"-child-{comm.rank}.json", "w") as f:
            json.dump(said, f)
        sys.exit(0)  # through Python's exit: atexit handlers, the communicator's finalizers
    _, status = os.waitpid(pid, 0)
    ok = []
    for i in range(20):  # the parent's job goes on, over the same transport and memory
        y = np.full(1 << 16, comm.rank + i, np.float64)
        comm.all_reduce(y)
        ok.append(bool(np.all(y == sum(r + i for r in range(comm.size)))))
    comm.barrier()
    print(
        json.dumps({"rank": comm.rank, "child_status": status, "ok": all(ok), "transport": comm._tuner.transport}),
        flush=True,
    )
