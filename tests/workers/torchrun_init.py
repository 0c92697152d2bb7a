"""``uniccl.init()`` in a program started by torchrun (no torch.distributed needed): the
world is torchrun's.  usage: torchrun_init.py OUT -- each rank writes OUT-<rank>.json with
what its collectives gave (files: torchrun's merged output may run the ranks' lines together)."""

import json
import sys

import numpy as np

import uniccl

with uniccl.init() as comm:
    x = np.arange(64, dtype=np.float64) + comm.rank
    comm.all_reduce(x)
    g = np.empty(comm.size, np.int64)
    comm.all_gather(np.array([comm.rank * 7], np.int64), g)
    with open(f"{sys.argv[1]}-{comm.rank}.json", "w") as f:
        json.dump(
            {
                "rank": comm.rank,
                "size": comm.size,
                "local": [comm.local_rank, comm.local_size],
                "all_reduce": x.tolist(),
                "all_gather": g.tolist(),
            },
            f,
        )
