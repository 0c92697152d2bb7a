"""all_reduce through torch.distributed: backend "uniccl" against "gloo", same job, same tensors.

usage: uniccl run -n 2 python benchmarks/torch_busbw.py PORT [REPS]
Each rank opens gloo and two uniccl groups over one TCPStore: "uniccl" as torch users get it
(float sums in gloo's order, bitwise gloo's results) and "native" (UNICCL_TORCH_ORDER=native,
uniccl's own algorithms); per size, blocks of calls alternate between them; rank 0 prints the
median per-call time and bus bandwidth of each and the ratios to gloo.
"""

import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

from uniccl.torch import register

register()
port, reps = int(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 9
rank, size = int(os.environ["UNICCL_RANK"]), int(os.environ["UNICCL_WORLD_SIZE"])
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=size)
groups = {"gloo": dist.group.WORLD, "uniccl": dist.new_group(backend="uniccl")}
os.environ["UNICCL_TORCH_ORDER"] = "native"  # read when a group is made
groups["native"] = dist.new_group(backend="uniccl")
factor = 2 * (size - 1) / size
for nbytes, inner in ((1 << 20, 20), (64 << 20, 2)):
    t = torch.ones(nbytes // 4, dtype=torch.float32)
    times = {k: [] for k in groups}
    for g in groups.values():  # warm up
        dist.all_reduce(t, group=g)
    for _ in range(reps):
        for k, g in groups.items():
            dist.barrier(group=groups["gloo"])
            t0 = time.perf_counter()
            for _ in range(inner):
                dist.all_reduce(t, group=g)
            times[k].append((time.perf_counter() - t0) / inner)
    if rank == 0:
        med = {k: statistics.median(v) for k, v in times.items()}
        bw = {k: nbytes / v / 1e9 * factor for k, v in med.items()}
        print(
            f"{size} ranks {nbytes >> 20} MiB: "
            + ", ".join(
                f"{k} {med[k] * 1e3:.2f} ms {bw[k]:.2f} GB/s" + (f" ({bw[k] / bw['gloo']:.2f}x)" if k != "gloo" else "")
                for k in groups
            ),
            flush=True,
        )
dist.destroy_process_group()
