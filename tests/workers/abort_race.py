"""abort() from a watchdog thread while another thread is inside a shared-memory call, again
and again (under ``uniccl run -n 2``): the engine must outlive every thread inside it.  Each
round rank 0 makes a fresh 2-rank communicator, starts an all_reduce that rank 1 never joins
on a second thread, aborts from the main thread after a random 0-20 ms, and joins the thread.
usage: abort_race.py ROUNDS -- prints "rounds N ok" (a crash ends the process by a signal)."""

import random
import sys
import threading
import time

import numpy as np

import uniccl

rounds = int(sys.argv[1])
world = uniccl.init()
t = world._t  # the world's control channel shares each round's unique id
rng = random.Random(1234)
outcomes = {}
for i in range(rounds):
    uid = t.bcast_obj(bytes(uniccl.get_unique_id()) if world.rank == 0 else None, 0)
    comm = uniccl.Communicator(uid, world.rank, 2, timeout=60)
    assert comm._engine is not None, "no shared-memory engine: the race is not exercised"
    if world.rank == 0:
        seen = []

        def hung():
            x = np.ones(1 << 12)
            try:
                comm.all_reduce(x)
                seen.append("returned")
            except uniccl.UnicclError as exc:
                seen.append(type(exc).__name__)
                str(exc)  # its message is read after the abort: from freed memory, before the fix

        th = threading.Thread(target=hung)
        th.start()
        time.sleep(rng.uniform(0, 0.02))
        comm.abort("stress")
        th.join(30)
        assert not th.is_alive(), f"round {i}: the call did not end after abort"
        outcomes[seen[0]] = outcomes.get(seen[0], 0) + 1
    t.allgather_obj(None)  # rank 1 stays out of the call until rank 0 is done
    try:
        comm.destroy()
    except uniccl.UnicclError:
        pass
world.destroy()
if world.rank == 0:
    print(f"rounds {rounds} ok {outcomes}", flush=True)
