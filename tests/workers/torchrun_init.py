"""``uniccl.init()`` in a program started by torchrun (no torch.distributed needed): the
world is torchrun's.  Prints one JSON line per rank with what its collectives gave."""
import json

import numpy as np

import uniccl

with uniccl.init() as comm:
    x = np.arange(64, dtype=np.float64) + comm.rank
    comm.all_reduce(x)
    g = np.empty(comm.size, np.int64)
    comm.all_gather(np.array([comm.rank * 7], np.int64), g)
    print(json.dumps({"rank": comm.rank, "size": comm.size, "local": [comm.local_rank, comm.local_size],
                      "all_reduce": x.tolist(), "all_gather": g.tolist()}), flush=True)
