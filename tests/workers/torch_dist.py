"""torch.distributed through a backend: the collective API surface (DDP training is
examples/torch/ddp.py).  usage: torch_dist.py api BACKEND PORT OUT   (under uniccl run)

Every collective with inputs made from the rank; OUT-<rank>.json: name -> result values.
"""

import json
import os
import sys
import time

import torch
import torch.distributed as dist

from uniccl.torch import register

register()  # "uniccl" as a torch.distributed backend (importing uniccl.torch does it too)

mode, backend, port, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
rank, size = int(os.environ["UNICCL_RANK"]), int(os.environ["UNICCL_WORLD_SIZE"])
dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=size)
assert dist.get_backend() == backend
f64 = torch.float64


def vec(n, dtype=f64, base=1):
    return torch.arange(n, dtype=dtype) + base + 10 * rank  # integer-valued: sums are exact


def api() -> dict:
    res = {}

    def keep(name, fn):
        try:
            res[name] = fn()
        except (RuntimeError, ValueError, NotImplementedError) as exc:  # e.g. an op gloo lacks
            res[name] = {"error": type(exc).__name__}

    for op in ("SUM", "PRODUCT", "MIN", "MAX", "AVG"):

        def ar(op=op):
            t = vec(6)
            dist.all_reduce(t, op=getattr(dist.ReduceOp, op))
            return t.tolist()

        keep(f"all_reduce_{op}", ar)

    def ar_int():
        t = vec(5, torch.int32)
        dist.all_reduce(t)
        return t.tolist()

    keep("all_reduce_int32", ar_int)

    def ar_noncontig():
        t = vec(12).reshape(3, 4).t()  # a transposed view
        dist.all_reduce(t)
        return t.reshape(-1).tolist()

    keep("all_reduce_noncontiguous", ar_noncontig)

    def ar_pending():  # async_op=True returns at once; a call made meanwhile runs after it
        t, u = vec(3), vec(2)
        if rank == 1:
            time.sleep(0.5)
        t0 = time.monotonic()
        work = dist.all_reduce(t, async_op=True)
        early = [time.monotonic() - t0 < 0.25, not work.is_completed()]
        dist.all_reduce(u)
        work.wait()
        return [early if rank == 0 else None, t.tolist(), u.tolist()]

    keep("all_reduce_async_pending", ar_pending)

    def ar_in_callback():  # a collective issued from a future's callback (PowerSGD's hooks do)
        t = vec(3)

        def then(fut):
            u = vec(2)
            dist.all_reduce(u, async_op=True).get_future().wait()
            return [fut.value()[0].tolist(), u.tolist()]

        return dist.all_reduce(t, async_op=True).get_future().then(then).wait()

    keep("all_reduce_in_callback", ar_in_callback)

    def ar_order():  # floats whose sum depends on the order of the terms: gloo's ring order
        g = torch.Generator().manual_seed(7 + rank)
        t = torch.randn(3001, generator=g, dtype=f64) * 10.0 ** torch.randint(-4, 5, (3001,), generator=g)
        mine = t.clone()
        dist.all_reduce(t)
        return [mine.tolist(), t.tolist()]

    keep("all_reduce_float_order", ar_order)

    def ar_async():
        t = vec(4)
        work = dist.all_reduce(t, async_op=True)
        fut = work.get_future()
        work.wait()
        return [t.tolist(), fut.value()[0].tolist()]

    keep("all_reduce_async", ar_async)

    def bc():
        t = vec(5)
        dist.broadcast(t, src=size - 1)
        return t.tolist()

    keep("broadcast", bc)

    def rd():
        t = vec(5)
        dist.reduce(t, dst=0)
        return t.tolist() if rank == 0 else None

    keep("reduce", rd)

    def ag():
        outs = [torch.zeros(3, dtype=f64) for _ in range(size)]
        dist.all_gather(outs, vec(3))
        return [o.tolist() for o in outs]

    keep("all_gather", ag)

    def agt():
        o = torch.zeros(3 * size, dtype=f64)
        dist.all_gather_into_tensor(o, vec(3))
        return o.tolist()

    keep("all_gather_into_tensor", agt)

    def rs():
        o = torch.zeros(2, dtype=f64)
        dist.reduce_scatter(o, [vec(2, base=i) for i in range(size)])
        return o.tolist()

    keep("reduce_scatter", rs)

    def rst():
        o = torch.zeros(2, dtype=f64)
        dist.reduce_scatter_tensor(o, vec(2 * size))
        return o.tolist()

    keep("reduce_scatter_tensor", rst)

    def a2a_single():
        o = torch.zeros(2 * size, dtype=f64)
        dist.all_to_all_single(o, vec(2 * size))
        return o.tolist()

    keep("all_to_all_single", a2a_single)

    def a2a_splits():  # rank r sends r+1+j elements to rank j
        ins = [rank + 1 + j for j in range(size)]
        outs = [j + 1 + rank for j in range(size)]
        o = torch.zeros(sum(outs), dtype=f64)
        dist.all_to_all_single(o, vec(sum(ins)), output_split_sizes=outs, input_split_sizes=ins)
        return o.tolist()

    keep("all_to_all_single_splits", a2a_splits)

    def a2a():
        outs = [torch.zeros(2, dtype=f64) for _ in range(size)]
        dist.all_to_all(outs, [vec(2, base=j) for j in range(size)])
        return [o.tolist() for o in outs]

    keep("all_to_all", a2a)

    def ga():
        outs = [torch.zeros(3, dtype=f64) for _ in range(size)] if rank == 0 else None
        dist.gather(vec(3), outs, dst=0)
        return [o.tolist() for o in outs] if rank == 0 else None

    keep("gather", ga)

    def sc():
        o = torch.zeros(3, dtype=f64)
        dist.scatter(o, [vec(3, base=j) for j in range(size)] if rank == 0 else None, src=0)
        return o.tolist()

    keep("scatter", sc)

    def p2p():
        o = torch.zeros(4, dtype=f64)
        reqs = [dist.isend(vec(4), (rank + 1) % size), dist.irecv(o, (rank - 1) % size)]
        for r in reqs:
            r.wait()
        return o.tolist()

    keep("send_recv_ring", p2p)

    def bar():
        dist.barrier()
        return True

    keep("barrier", bar)
    return res


result = api()
with open(f"{out}-{rank}.json", "w") as f:
    json.dump(result, f)
dist.barrier()
dist.destroy_process_group()
