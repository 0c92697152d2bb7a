"""Elastic training: a rank is lost at step 5, the others go on, and it is back by step 10.

    uniccl run --enable-recovery --max-restarts 1 -n 4 python examples/elastic_train.py

Least squares by SGD, the gradient averaged over the ranks by all_reduce.  Rank 2 dies at step
5 (SIGKILL, as a lost node); the survivors' all_reduce raises RemoteError naming it, they
``shrink()`` and redo the step at 3 ranks.  The launcher starts rank 2's command again
(``UNICCL_RESTART_COUNT=1``); at step 10 the survivors ``grow()`` back to 4 with it: their rank
0 makes a unique id and leaves it in ``--dir`` (the joiner's out-of-band channel), the joiner
calls ``uniccl.Communicator(uid, 3, 4)`` and gets the weights and the step by broadcast.  At
the end every rank checks the weights against numpy's replay of the same schedule (float64).
Without ``--max-restarts`` (``uniccl examples`` runs it so), or below 3 ranks, nobody is lost.
"""

import argparse
import hashlib
import json
import os
import signal
import sys
import time
from pathlib import Path

import numpy as np

import uniccl

STEPS, LOSE_AT, BACK_AT, LR, DIM = 15, 5, 10, 0.05, 16
ap = argparse.ArgumentParser()
ap.add_argument("--dir", type=Path, help="where the survivors leave the unique id (default: ./.elastic-<job>)")
args = ap.parse_args()
job = hashlib.sha256(os.environ.get("UNICCL_JOB_SECRET", "").encode()).hexdigest()[:12]
folder = args.dir or Path(f".elastic-{job}")
restart = int(os.environ.get("UNICCL_RESTART_COUNT", "0"))
W_TRUE = np.linspace(-1.0, 1.0, DIM)


def batch(step, rank, size):
    """Rank ``rank``'s data at ``step`` in a communicator of ``size``: the same in the replay."""
    rng = np.random.default_rng([step, rank, size])
    x = rng.standard_normal((8, DIM))
    return x, x @ W_TRUE + 0.01 * rng.standard_normal(8)


def gradient(w, step, rank, size):
    x, y = batch(step, rank, size)
    return x.T @ (x @ w - y) / len(y)


def replay(sizes):
    """numpy's run of the same schedule, one process: the reference."""
    w = np.zeros(DIM)
    for step, size in enumerate(sizes):
        w = w - LR * sum(gradient(w, step, r, size) for r in range(size)) / size
    return w


if restart:  # started again by the launcher: join the survivors with the unique id they leave
    ticket = folder / f"rejoin-{restart}.json"
    deadline = time.monotonic() + 120
    while not ticket.exists():
        if time.monotonic() > deadline:
            sys.exit(f"restart {restart}: no {ticket} within 120 s")
        time.sleep(0.02)
    t = json.loads(ticket.read_text())
    comm = uniccl.Communicator(bytes.fromhex(t["uid"]), t["rank"], t["size"])
    w, step, sizes = comm.broadcast_object(None, root=0)
else:
    comm = uniccl.init()
    w, step, sizes = np.zeros(DIM), 0, []
    if comm.rank == 0:
        folder.mkdir(mode=0o700, exist_ok=True)
full = int(os.environ.get("UNICCL_WORLD_SIZE", comm.size))
elastic = int(os.environ.get("UNICCL_MAX_RESTARTS", "0")) >= 1 and full >= 3
lost = 0  # ranks lost and not yet back
while step < STEPS:
    if elastic and not restart and comm.rank == 2 and step == LOSE_AT and comm.size == full:
        os.kill(os.getpid(), signal.SIGKILL)  # a lost node
    if elastic and lost and step >= BACK_AT:  # the restarted rank is back: grow
        uid = comm.broadcast_object(uniccl.get_unique_id() if comm.rank == 0 else None)
        if comm.rank == 0:
            tmp = folder / ".rejoin.tmp"
            tmp.write_text(json.dumps({"uid": bytes(uid).hex(), "rank": comm.size, "size": comm.size + lost}))
            os.replace(tmp, folder / f"rejoin-{lost}.json")
        old, comm = comm, comm.grow(comm.size + lost, uid)
        old.destroy()
        comm.broadcast_object((w, step, sizes), root=0)
        lost = 0
    g = gradient(w, step, comm.rank, comm.size)
    try:
        comm.all_reduce(g)
    except uniccl.RemoteError as exc:  # a peer died: go on with the survivors, this step again
        old, comm = comm, comm.shrink()
        old.abort(f"rank {exc.remote_rank} was lost")
        lost += 1
        continue
    w = w - LR * g / comm.size
    sizes.append(comm.size)
    step += 1
want = replay(sizes)
ok = np.allclose(w, want, rtol=1e-12, atol=1e-14)
print(
    f"rank {comm.rank}/{comm.size}: elastic_train {'OK' if ok else 'MISMATCH'}"
    f" ({STEPS} steps at sizes {sizes}; weights {'match' if ok else 'differ from'} numpy's)",
    flush=True,
)
comm.barrier()
if comm.rank == 0 and not restart:
    for f in folder.glob("rejoin-*.json"):
        f.unlink()
    folder.rmdir()
comm.destroy()
sys.exit(0 if ok else 1)
