"""DDP training with the "uniccl" torch.distributed backend, as a torchrun user writes it.

    torchrun --standalone --nproc-per-node 2 examples/torch/ddp.py            # backend uniccl
    torchrun --standalone --nproc-per-node 2 examples/torch/ddp.py --backend gloo
    uniccl run -n 2 python examples/torch/ddp.py                              # env:// works there too

Nothing but torch's own launcher variables (RANK, WORLD_SIZE, MASTER_ADDR, ...) is needed:
``init_process_group`` reads them (``env://``), and the backend meets through torch's store.
A small MLP, a fixed seed, 20 SGD steps on rank-specific data, float64 and float32; the ranks
start from different weights (DDP's first broadcast makes them equal).  Every rank checks that
all ranks end with the same parameters; ``--out PREFIX`` saves them to PREFIX-<rank>.pt.
"""

import argparse

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import uniccl.torch  # noqa: F401  (registers the "uniccl" backend)

parser = argparse.ArgumentParser()
parser.add_argument("--backend", default="uniccl")
parser.add_argument("--steps", type=int, default=20)
parser.add_argument("--out", help="save the final parameters to OUT-<rank>.pt")
args = parser.parse_args()

dist.init_process_group(args.backend)
rank, size = dist.get_rank(), dist.get_world_size()
final = {}
for dtype in (torch.float64, torch.float32):
    torch.manual_seed(1234)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4)).to(dtype)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.5 * rank)
    net = DDP(model)
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    gen = torch.Generator().manual_seed(100 + rank)
    for _ in range(args.steps):
        x = torch.randn(8, 16, generator=gen, dtype=dtype)
        y = torch.randn(8, 4, generator=gen, dtype=dtype)
        opt.zero_grad()
        torch.nn.functional.mse_loss(net(x), y).backward()
        opt.step()
    params = [p.detach().clone() for p in model.parameters()]
    flat = torch.cat([p.reshape(-1) for p in params])
    everyone = [torch.empty_like(flat) for _ in range(size)]
    dist.all_gather(everyone, flat)
    assert all(torch.equal(e, flat) for e in everyone), f"rank {rank}: the ranks' {dtype} parameters differ"
    final[str(dtype)] = params
if args.out:
    torch.save(final, f"{args.out}-{rank}.pt")
print(f"rank {rank}/{size} backend {dist.get_backend()}: {args.steps} steps, parameters equal on every rank")
dist.barrier()  # no rank tears its backend down while a peer's last messages are still on the way
dist.destroy_process_group()
