"""Is the torch backend's all_reduce bit for bit gloo's?  Every rank opens a gloo and a uniccl
group and all_reduces the same tensors in both (sizes 1 to 3e6, float64/32/16, bfloat16,
complex128; terms spread over six orders of magnitude, so that the order they are added in
shows in the result; and PRODUCT for the small float64 ones).

usage: uniccl run -n 4 python benchmarks/gloo_order_check.py PORT   (UNICCL_TRANSPORT=tcp for TCP;
       UNICCL_TORCH_ORDER=native to see uniccl's own order differ)
Each rank prints how many cases differed ("rank R: D of C cases differ").
"""

import os
import sys

import numpy as np
import torch
import torch.distributed as dist

import uniccl.torch  # noqa: F401  (registers the backend)

rank, size = int(os.environ["UNICCL_RANK"]), int(os.environ["UNICCL_WORLD_SIZE"])
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{sys.argv[1]}", rank=rank, world_size=size)
ours = dist.new_group(backend="uniccl")
cases = bad = 0
for n in (1, 2, 3, 5, 7, 8, 9, 100, 1001, 4096, 131071, 131072, 131073, 300000, 1 << 20, 3_000_001):
    for dtype in (torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.complex128):
        g = np.random.default_rng(n * 10 + rank)
        x = torch.from_numpy(g.standard_normal(n) * 10.0 ** g.uniform(-3, 3, n)).to(dtype)
        if dtype.is_complex:
            x = x * (1 + 1j)
        ops = [dist.ReduceOp.SUM] + ([dist.ReduceOp.PRODUCT] if n < 5000 and dtype == torch.float64 else [])
        for op in ops:
            a, b = x.clone(), x.clone()
            dist.all_reduce(a, op=op)
            dist.all_reduce(b, op=op, group=ours)
            cases += 1
            if not torch.equal(a, b):
                bad += 1
                print(f"rank {rank}: differs: {n} elements, {dtype}, {op}", flush=True)
print(f"rank {rank}: {bad} of {cases} cases differ", flush=True)
dist.destroy_process_group()
