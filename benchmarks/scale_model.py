"""Predict all_reduce at up to 16384 ranks with the alpha-beta-gamma cost model (docs/scale.md).

    .venv/bin/python benchmarks/scale_model.py                       # the assumed network, plots into docs/
    .venv/bin/python benchmarks/scale_model.py --measured table.json # alpha/beta(/gamma) measured here
    .venv/bin/python benchmarks/scale_model.py --alpha 2e-6 --beta 2e-11 --no-plots --markdown

For each message size (default 8 B, 1 MiB, 256 MiB) it prints a table of the predicted time per
algorithm for n = 2, 4, ... 16384 ranks and the best, the rank counts where ring and each tree
cross over (checked at every integer n), then the message sizes where they cross at n = 1024, and
draws docs/scale-model.png (time vs n, one panel per size) and docs/scale-crossover.png.

The network by default: 100 Gb/s (beta = 8e-11 s/B) and 5 us per message (alpha), one network
endpoint per rank; gamma = 1/12e9 s/B (the tuner's reduction constant, a CPU sum).  The hierarchical
variants put --ranks-per-host ranks (8) on a host, reduce and broadcast there over shared memory
(--local-alpha 0.5 us, --local-beta 1/20e9 s/B = 20 GB/s) and run ring or the double binary tree
among the host leaders.  ``--measured FILE`` reads {"alpha_s", "beta_s_per_byte",
"gamma_s_per_byte"} (gamma optional) as written by uniccl.comm.costmodel.write_table; an explicit
--alpha/--beta/--gamma still wins over the file.

The formulas are core/uniccl/comm/costmodel.py's (loaded from this checkout by its path, so the
script needs no build of uniccl); matplotlib is needed only for the plots.
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _load_costmodel():
    path = ROOT / "core" / "uniccl" / "comm" / "costmodel.py"
    spec = importlib.util.spec_from_file_location("_uniccl_costmodel", path)
    if spec is None or spec.loader is None:
        sys.exit(f"cannot load {path}")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


cm = _load_costmodel()

# Column name -> label in the tables and plots.
ALGOS = {
    "ring": "ring",
    "rec_dbl": "recursive doubling",
    "tree": "binary tree",
    "dbt": "double binary tree",
    "hier_ring": "hierarchical + ring",
    "hier_dbt": "hierarchical + DBT",
}
UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(text: str) -> int:
    """8, 4K, 1M, 256M, 1G (binary units, as nccl-tests reads them)."""
    t = text.strip().upper().removesuffix("B").removesuffix("I")
    mult = UNITS.get(t[-1:], 1)
    value = int(float(t[:-1] if t[-1:] in UNITS else t) * mult)
    if value < 1:
        raise argparse.ArgumentTypeError(f"size {text!r} must be at least 1 byte")
    return value


def size_label(nbytes: float) -> str:
    for unit, mult in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= mult:
            v = nbytes / mult
            return f"{v:.0f} {unit}" if v == int(v) else f"{v:.3g} {unit}"
    return f"{nbytes:.0f} B"


def time_label(s: float) -> str:
    if s < 1e-3:
        return f"{s * 1e6:.1f} us"
    if s < 1:
        return f"{s * 1e3:.2f} ms"
    return f"{s:.3f} s"


class Model:
    """The cost model's functions with this run's constants."""

    def __init__(self, a: argparse.Namespace):
        self.alpha, self.beta, self.gamma = a.alpha, a.beta, a.gamma
        self.local = {
            "ranks_per_host": a.ranks_per_host,
            "local_alpha": a.local_alpha,
            "local_beta": a.local_beta,
            "min_chunk": a.min_chunk,
        }
        self.min_chunk = a.min_chunk

    def cost(self, algo: str, nbytes: float, n: int) -> float:
        p = (nbytes, n, self.alpha, self.beta, self.gamma)
        if algo == "ring":
            return cm.ring(*p)
        if algo == "rec_dbl":
            return cm.recursive_doubling(*p)
        if algo == "tree":
            return cm.tree(*p)
        if algo == "dbt":
            return cm.double_binary_tree(*p, min_chunk=self.min_chunk)
        if algo == "hier_ring":
            return cm.hierarchical(*p, inter="ring", **self.local)
        if algo == "hier_dbt":
            return cm.hierarchical(*p, inter="double_binary_tree", **self.local)
        raise ValueError(algo)

    def all(self, nbytes: float, n: int) -> dict[str, float]:
        return {algo: self.cost(algo, nbytes, n) for algo in ALGOS}

    def best(self, nbytes: float, n: int) -> str:
        costs = self.all(nbytes, n)
        return min(costs, key=costs.__getitem__)


def rank_crossings(model: Model, nbytes: int, other: str, max_ranks: int) -> list[tuple[int, str]]:
    """Every n in 3..max_ranks where the faster of ring and ``other`` differs from n - 1's: (n, the
    one faster from n on).  The first entry is (2, whichever is faster at 2)."""
    out: list[tuple[int, str]] = []
    prev = None
    for n in range(2, max_ranks + 1):
        winner = other if model.cost(other, nbytes, n) < model.cost("ring", nbytes, n) else "ring"
        if winner != prev:
            out.append((n, winner))
            prev = winner
    return out


def _bisect_size(pred, lo: int, hi: int) -> int:
    """Smallest integer in (lo, hi] where pred holds, given pred(lo) != pred(hi) and pred(hi)."""
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if pred(mid) == pred(hi):
            hi = mid
        else:
            lo = mid
    return hi


def size_crossings(model: Model, n: int, contenders: list[str], lo: int = 1, hi: int = 1 << 40):
    """Where the fastest of ``contenders`` changes along message sizes lo..hi at n ranks: a list of
    (first size in bytes, the fastest from there), found on a 1/16-octave grid then bisected to the byte."""

    def fastest(m: int) -> str:
        return min(contenders, key=lambda a: model.cost(a, m, n))

    grid = sorted({max(lo, min(hi, round(2 ** (i / 16)))) for i in range(0, 16 * hi.bit_length() + 1)})
    out = [(grid[0], fastest(grid[0]))]
    for a, b in zip(grid, grid[1:]):
        x, cur = a, out[-1][1]
        while fastest(b) != cur:  # bisect to the byte where `cur` stops being the fastest
            first = _bisect_size(lambda m: fastest(m) != cur, x, b)
            x, cur = first, fastest(first)
            out.append((first, cur))
    return out


def describe_ranks(crossings: list[tuple[int, str]], max_ranks: int) -> str:
    if len(crossings) == 1:
        return f"{ALGOS[crossings[0][1]]} faster at every n up to {max_ranks}"
    parts = [f"{ALGOS[crossings[0][1]]} faster from n = 2"]
    parts += [f"{ALGOS[w]} from n = {n}" for n, w in crossings[1:]]
    return ", ".join(parts)


def describe_sizes(crossings) -> str:
    parts = [f"{ALGOS[crossings[0][1]]} fastest from {crossings[0][0]} B"]
    parts += [f"{ALGOS[w]} from {m} B ({size_label(m)})" for m, w in crossings[1:]]
    return ", ".join(parts)


def table(model: Model, nbytes: int, ranks: list[int], markdown: bool) -> list[str]:
    head = ["n", *ALGOS, "best"]
    rows = []
    for n in ranks:
        costs = model.all(nbytes, n)
        best = min(costs, key=costs.__getitem__)
        rows.append([str(n), *(time_label(costs[a]) for a in ALGOS), best])
    if markdown:
        lines = ["| " + " | ".join(head) + " |", "|" + "---:|" * (len(head) - 1) + "---|"]
        lines += ["| " + " | ".join(r) + " |" for r in rows]
        return lines
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(head)]
    fmt = "  ".join(f"%{w}s" for w in widths)
    return [fmt % tuple(head), *(fmt % tuple(r) for r in rows)]


def plot_model(model: Model, sizes: list[int], max_ranks: int, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ranks = [1 << k for k in range(1, max_ranks.bit_length()) if 1 << k <= max_ranks]
    fig, axes = plt.subplots(1, len(sizes), figsize=(5.2 * len(sizes), 4.4), squeeze=False)
    for ax, nbytes in zip(axes[0], sizes):
        for algo, label in ALGOS.items():
            ax.plot(ranks, [model.cost(algo, nbytes, n) for n in ranks], marker=".", label=label)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("ranks n")
        ax.set_title(f"all_reduce {size_label(nbytes)}")
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].set_ylabel("predicted time (s)")
    axes[0][0].legend(fontsize=8)
    fig.suptitle(_params_line(model), fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_crossover(model: Model, max_ranks: int, at_n: int, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ranks = [1 << k for k in range(1, max_ranks.bit_length()) if 1 << k <= max_ranks]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.4))
    for other in ("rec_dbl", "tree", "dbt"):
        xs, ys = [], []
        for n in ranks:
            # the smallest size from which ring stays faster than `other` (none: ring never wins there)
            cross = size_crossings(model, n, ["ring", other])
            if cross[-1][1] == "ring" and len(cross) > 1:
                xs.append(n)
                ys.append(cross[-1][0])
        left.plot(xs, ys, marker="o", label=f"ring vs {ALGOS[other]}")
    left.set_xscale("log", base=2)
    left.set_yscale("log", base=2)
    left.set_xlabel("ranks n")
    left.set_ylabel("message size (bytes) above which ring is faster")
    left.set_title("ring/tree crossover size (no point: ring faster at every size)")
    left.grid(True, which="both", alpha=0.3)
    left.legend(fontsize=8)
    sizes = [1 << k for k in range(0, 37)]
    for algo, label in ALGOS.items():
        right.plot(sizes, [model.cost(algo, m, at_n) for m in sizes], label=label)
    for i, (m, w) in enumerate(size_crossings(model, at_n, list(ALGOS))[1:]):
        right.axvline(m, color="grey", lw=0.6, ls=":")
        y = (0.02, 0.3, 0.58)[i % 3]  # staggered: neighbouring changes would print over each other
        right.text(
            m,
            y,
            f" {ALGOS[w]} from {size_label(m)}",
            transform=right.get_xaxis_transform(),
            rotation=90,
            fontsize=7,
            va="bottom",
        )
    right.set_xscale("log", base=2)
    right.set_yscale("log")
    right.set_xlabel("message size (bytes)")
    right.set_ylabel("predicted time (s)")
    right.set_title(f"n = {at_n}: time vs size (dotted: where the best changes)")
    right.grid(True, which="both", alpha=0.3)
    right.legend(fontsize=7)
    fig.suptitle(_params_line(model), fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _params_line(model: Model) -> str:
    loc = model.local
    return (
        f"alpha {model.alpha * 1e6:g} us, beta {model.beta:.3g} s/B ({8 / model.beta / 1e9:.4g} Gb/s), "
        f"gamma {model.gamma:.3g} s/B; {loc['ranks_per_host']} ranks/host over shm "
        f"({loc['local_alpha'] * 1e6:g} us, {1 / loc['local_beta'] / 1e9:.3g} GB/s)"
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--alpha", type=float, help="seconds per message (default 5e-6)")
    p.add_argument("--beta", type=float, help="seconds per byte on the network (default 8e-11: 100 Gb/s)")
    p.add_argument("--gamma", type=float, help="seconds per byte reduced (default 1/12e9)")
    p.add_argument("--measured", metavar="FILE", help='JSON {"alpha_s", "beta_s_per_byte", "gamma_s_per_byte"}')
    p.add_argument("--sizes", default="8,1M,256M", help="message sizes, comma-separated (default 8,1M,256M)")
    p.add_argument("--max-ranks", type=int, default=16384, help="largest n (default 16384)")
    p.add_argument("--crossover-ranks", type=int, default=1024, help="n of the crossover sizes (default 1024)")
    p.add_argument("--ranks-per-host", type=int, default=8)
    p.add_argument("--local-alpha", type=float, default=0.5e-6, help="shared memory: seconds per message")
    p.add_argument("--local-beta", type=float, default=1 / 20e9, help="shared memory: seconds per byte")
    p.add_argument("--min-chunk", type=int, default=cm.MIN_CHUNK, help="DBT pipeline: smallest chunk per tree")
    p.add_argument("--out", default=str(ROOT / "docs"), help="folder of the plots (default docs/)")
    p.add_argument("--no-plots", action="store_true")
    p.add_argument("--markdown", action="store_true", help="tables as Markdown")
    a = p.parse_args(argv)
    a.source = "assumed network"
    if a.measured:
        try:
            t = cm.load_table(a.measured)
        except (OSError, ValueError) as e:
            p.error(f"--measured: {e}")
        a.source = f"measured, {a.measured}"
        a.alpha = t.alpha if a.alpha is None else a.alpha
        a.beta = t.beta if a.beta is None else a.beta
        a.gamma = t.gamma if a.gamma is None else a.gamma
    a.alpha = 5e-6 if a.alpha is None else a.alpha
    a.beta = 8 / 100e9 if a.beta is None else a.beta
    a.gamma = 1 / 12e9 if a.gamma is None else a.gamma
    for name in ("alpha", "beta", "gamma", "local_alpha", "local_beta"):
        v = getattr(a, name)
        if not math.isfinite(v) or v < 0 or (name in ("beta", "local_beta") and v == 0):
            p.error(f"--{name.replace('_', '-')} must be a finite number >= 0 (beta > 0), got {v}")
    if a.max_ranks < 2 or a.ranks_per_host < 1 or a.min_chunk < 1:
        p.error("--max-ranks >= 2, --ranks-per-host >= 1 and --min-chunk >= 1")
    a.size_list = [parse_size(s) for s in a.sizes.split(",") if s.strip()]
    return a


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    model = Model(a)
    ranks = [1 << k for k in range(1, a.max_ranks.bit_length()) if 1 << k <= a.max_ranks]
    print(f"# all_reduce, alpha-beta-gamma model ({a.source}): {_params_line(model)}")
    print(f"# columns: {', '.join(f'{k} = {v}' for k, v in ALGOS.items())}")
    for nbytes in a.size_list:
        print(f"\n## {size_label(nbytes)} ({nbytes} B)")
        print("\n".join(table(model, nbytes, ranks, a.markdown)))
        for other in ("tree", "dbt", "rec_dbl"):
            cross = rank_crossings(model, nbytes, other, a.max_ranks)
            print(f"ring/{other}: {describe_ranks(cross, a.max_ranks)}")
    n = a.crossover_ranks
    print(f"\n## crossover message sizes at n = {n}")
    for other in ("tree", "dbt", "rec_dbl", "hier_ring", "hier_dbt"):
        print(f"ring/{other}: {describe_sizes(size_crossings(model, n, ['ring', other]))}")
    print(f"best of all: {describe_sizes(size_crossings(model, n, list(ALGOS)))}")
    if not a.no_plots:
        out = Path(a.out)
        out.mkdir(parents=True, exist_ok=True)
        plot_model(model, a.size_list, a.max_ranks, out / "scale-model.png")
        plot_crossover(model, a.max_ranks, n, out / "scale-crossover.png")
        print(f"\nplots: {out / 'scale-model.png'}, {out / 'scale-crossover.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
