"""``uniccl bench``: an nccl-tests style collective benchmark.

    uniccl bench all_reduce -np 4 -b 8 -e 128M -f 2 -d float32 -o sum

For every dtype, op and size it times the collective out of place and in place,
optionally checks the result exactly (``-c 1``), and prints nccl-tests' table
on rank 0: ``size count type redop root`` then ``time algbw busbw #wrong`` for
each mode.

* size: bytes of the per-rank *total* buffer (the receive buffer of
  all_gather/gather, the send buffer of reduce_scatter/all_to_all/scatter),
  rounded down to whole elements (and to a multiple of nranks where the buffer
  is split in per-rank blocks); ``count`` is the collective's count argument
  (elements per block for the split ones), like nccl-tests.
* time: nccl-tests' method: warm up, barrier, time ``-n`` back-to-back
  iterations, divide by ``-n``, average over ranks.  algbw = size / time;
  busbw = algbw x the collective's bus factor (:func:`busbw_factor`).
* check: inputs are small integers from a per-rank hash (period ``PERIOD``)
  bounded so that every dtype, op and reduction order gives an exact result;
  outputs are compared with a float64 numpy reference of what every rank
  contributed.  Floating avg may differ by rounding (an implementation may
  divide the sum or pre-multiply by 1/n), so it is compared within
  ``nranks`` relative epsilons; integer avg truncates toward zero like NCCL.

How it runs: under ``uniccl run -n N`` (the ranks meet over TCP, data moves over
shared memory within a host, or TCP with ``UNICCL_TRANSPORT=tcp``), under ``mpiexec``,
or alone; ``-np N`` outside a job relaunches itself as N ranks under mpiexec, or
under ``uniccl run`` when there is no mpiexec.  The header names every rank, the
transport and (last column) the path each size took; ``--json FILE`` (``-`` for
stdout, instead of the table) writes the rows, each with the run's facts
under ``"run"`` (:func:`run_facts`).

The pure helpers (size parsing, sweeps, bus factors, data and reference, table
formatting) need no communicator; one starts only when a benchmark runs.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import traceback

import numpy as np

from .._types import DType, ReduceOp, dtype_name
from .fit import fit_model

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "all_to_all", "gather", "scatter")
REDUCING = frozenset({"all_reduce", "reduce", "reduce_scatter"})
ROOTED = frozenset({"broadcast", "reduce", "gather", "scatter"})
# The size names the buffer that is split into nranks blocks; count = one block.
SPLIT = frozenset({"all_gather", "gather", "reduce_scatter", "all_to_all", "scatter"})
# nccl-tests' spellings (all_reduce_perf, -> allreduce): accepted for ours
ALIASES = {
    "allreduce": "all_reduce",
    "allgather": "all_gather",
    "reducescatter": "reduce_scatter",
    "alltoall": "all_to_all",
}
ALIASES.update({f"{c.replace('_', '')}_perf": c for c in COLLECTIVES})
ALIASES.update({f"{c}_perf": c for c in COLLECTIVES})

DTYPES = tuple(dtype_name(d) for d in DType)
_DTYPE_ALIASES = {
    "half": "float16",
    "fp16": "float16",
    "float": "float32",
    "fp32": "float32",
    "double": "float64",
    "fp64": "float64",
    "bf16": "bfloat16",
    "char": "int8",
    "int": "int32",
}
OPS = tuple(o.name.lower() for o in ReduceOp)

PERIOD = 65521  # check data repeat period: a prime, so it never lines up with power-of-two chunks
_MAX_SUM_VALUE = 9  # sum/avg inputs lie in 0..9 unless nranks forces less
_SUFFIXES = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_LAUNCHER_SIZE_VARS = ("UNICCL_WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE")
_LAUNCHER_RANK_VARS = ("UNICCL_RANK", "UNICCL_WORLD_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK")
_CHILD_MARK = "UNICCL_BENCH_CHILD"  # set on relaunched ranks: never relaunch twice


# ------------------------------------------------------------------ arguments
from .._env import parse_size  # noqa: E402  ONE size parser: -b/-e and the UNICCL_* sizes share it


def format_size(nbytes: int) -> str:
    """Inverse of parse_size for exact multiples: 1024 -> '1K', 1536 -> '1536'."""
    for suffix in ("T", "G", "M", "K"):
        unit = _SUFFIXES[suffix]
        if nbytes and nbytes % unit == 0:
            return f"{nbytes // unit}{suffix}"
    return str(nbytes)


def parse_dtypes(text: str) -> tuple:
    """'all', a name, or a comma list ('float32,bf16')."""
    if text.strip().lower() == "all":
        return DTYPES
    names = []
    for word in text.split(","):
        name = _DTYPE_ALIASES.get(word.strip().lower(), word.strip().lower())
        if name not in DTYPES:
            raise ValueError(f"unknown dtype {word!r}; expected 'all' or some of {', '.join(DTYPES)}")
        names.append(name)
    return tuple(dict.fromkeys(names))


def parse_ops(text: str) -> tuple:
    """'all', an op, or a comma list ('sum,max')."""
    if text.strip().lower() == "all":
        return OPS
    names = [w.strip().lower() for w in text.split(",")]
    for name in names:
        if name not in OPS:
            raise ValueError(f"unknown op {name!r}; expected 'all' or some of {', '.join(OPS)}")
    return tuple(dict.fromkeys(names))


def _argtype(fn, minimum=None):
    def convert(text):
        try:
            value = fn(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        if minimum is not None and value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
        return value

    convert.__name__ = getattr(fn, "__name__", "value")
    return convert


def collective_name(text: str) -> str:
    """A collective's name, or nccl-tests' spelling of it ('allreduce' -> 'all_reduce')."""
    name = text.strip().lower().replace("-", "_")
    return ALIASES.get(name, name)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "collective",
        nargs="?",
        type=collective_name,
        choices=COLLECTIVES + ("all",),
        help="collective to time, or all of them (nccl-tests' names too: allreduce, allgather, "
        "reducescatter, alltoall, all_reduce_perf, ...)",
    )
    p.add_argument(
        "--fit-model",
        metavar="FILE",
        help="instead of a collective: measure the tuner's alpha and beta (ranks 0 and 1, the sizes "
        "-b..-e) and gamma, and write them to FILE for UNICCL_TUNER_TABLE",
    )
    p.add_argument(
        "-b",
        "--minbytes",
        type=_argtype(parse_size),
        default=8,
        help="smallest size in bytes, K/M/G suffixes (default 8)",
    )
    p.add_argument("-e", "--maxbytes", type=_argtype(parse_size), default=64 << 20, help="largest size (default 64M)")
    p.add_argument(
        "-f",
        "--stepfactor",
        type=_argtype(int, 2),
        default=2,
        help="multiply the size by this between rows (default 2)",
    )
    p.add_argument("-n", "--iters", type=_argtype(int, 1), default=20, help="timed iterations (default 20)")
    p.add_argument(
        "-w",
        "--warmup",
        type=_argtype(int, 0),
        default=5,
        help="untimed iterations before each measurement (default 5)",
    )
    p.add_argument("-c", "--check", type=int, choices=(0, 1), default=1, help="check results (default 1)")
    p.add_argument(
        "-d",
        "--datatype",
        type=_argtype(parse_dtypes),
        default=("float32",),
        help="dtype, comma list or 'all' (default float32)",
    )
    p.add_argument(
        "-o", "--op", type=_argtype(parse_ops), default=("sum",), help="reduction op, comma list or 'all' (default sum)"
    )
    p.add_argument("-r", "--root", type=_argtype(int, 0), default=0, help="root rank (default 0)")
    p.add_argument(
        "--json",
        metavar="FILE",
        help="also write the rows, with the run's facts, as JSON (rank 0); '-': to stdout, instead of the table",
    )
    p.add_argument("--progress", action="store_true", help="progress on stderr even when it is not a TTY")
    p.add_argument(
        "-np",
        "--np",
        dest="np",
        type=_argtype(int, 1),
        metavar="N",
        help="run on N ranks: relaunch under mpiexec (else uniccl run) unless already one of N ranks",
    )
    p.add_argument("--run-command", help=argparse.SUPPRESS)  # -np's relaunched ranks: the user's command line


# ---------------------------------------------------------------- sizes, math
def size_sweep(minbytes: int, maxbytes: int, factor: int) -> list:
    """minbytes, minbytes*factor, ... <= maxbytes; -b 0 gives one 0 row, then 1, factor, ..."""
    if factor < 2:
        raise ValueError(f"step factor must be >= 2, got {factor}")
    if maxbytes < minbytes:
        raise ValueError(f"max size {maxbytes} is below min size {minbytes}")
    sizes, size = [], minbytes
    if size == 0:
        sizes.append(0)
        size = 1
    while size <= maxbytes:
        sizes.append(size)
        size *= factor
    return sizes


def counts(collective: str, nbytes: int, itemsize: int, nranks: int) -> tuple:
    """(elements in the total buffer, the count column) for a size in bytes."""
    total = nbytes // itemsize
    if collective in SPLIT:
        block = total // nranks
        return block * nranks, block
    return total, total


def plan_rows(collective: str, sizes, itemsize: int, nranks: int) -> list:
    """(bytes, total elements, count) per row: sizes whose count rounds to 0 are
    skipped (except a requested 0), sizes that round to the same row kept once."""
    rows, seen = [], set()
    for size in sizes:
        total, count = counts(collective, size, itemsize, nranks)
        if (count == 0 and size != 0) or total in seen:
            continue
        seen.add(total)
        rows.append((total * itemsize, total, count))
    return rows


def busbw_factor(collective: str, nranks: int) -> float:
    """algbw -> busbw, as nccl-tests: the fraction of the data each rank's link carries."""
    if collective == "all_reduce":
        return 2.0 * (nranks - 1) / nranks
    if collective in ("broadcast", "reduce"):
        return 1.0
    return (nranks - 1) / nranks  # all_gather, reduce_scatter, all_to_all, gather, scatter


# ------------------------------------------------------- check data, reference
def numpy_dtype(name: str) -> np.dtype:
    if name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def _finfo(dt: np.dtype):
    if dt.name == "bfloat16":
        import ml_dtypes

        return ml_dtypes.finfo(dt)
    return np.finfo(dt)


def _is_int(dt: np.dtype) -> bool:
    return dt.kind in "iu"


def exact_sum_limit(dt: np.dtype) -> int:
    """Largest n such that every integer 0..n is exact in ``dt`` (unsigned: keeps
    dtype max free for the sentinel)."""
    if _is_int(dt):
        return min(int(np.iinfo(dt).max) - (dt.kind == "u"), 1 << 53)
    return 1 << (_finfo(dt).nmant + 1)


def max_pow2_exponent(dt: np.dtype) -> int:
    """Largest k with 2**k representable in ``dt``."""
    if _is_int(dt):
        return int(np.iinfo(dt).max).bit_length() - 1
    return _finfo(dt).maxexp - 1


def _mix(rank: int, j: np.ndarray) -> np.ndarray:
    """A 64-bit hash of (rank, index) (splitmix64 finaliser)."""
    x = j.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    x += np.uint64(((rank + 1) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF)
    x ^= x >> np.uint64(31)
    x *= np.uint64(0x94D049BB133111EB)
    x ^= x >> np.uint64(29)
    return x


class CheckData:
    """Deterministic inputs for one dtype and op on ``nranks`` ranks, and the reference.

    Rank r's input at element i is ``pattern(r)[i % PERIOD]``.  Values are bounded
    so the result is exact in every reduction order: sum/avg add at most
    ``window`` values in 0..hi (total within the dtype's exact integers), prod
    multiplies 1s and at most ``window`` 2s (within the dtype's range); ranks
    outside element i's window contribute the identity.  The window rotates with
    i, so every rank matters somewhere; it is all ranks unless nranks is huge.
    """

    def __init__(self, dtype_name: str, op: str | None, nranks: int):
        self.dtype = dt = numpy_dtype(dtype_name)
        self.op, self.nranks = op, nranks
        self.window, self.identity = nranks, 0
        if op in ("sum", "avg"):
            limit = exact_sum_limit(dt)
            self.lo, self.hi = 0, max(1, min(_MAX_SUM_VALUE, limit // nranks))
            self.window = min(nranks, limit // self.hi)
            result = (0, self.window * self.hi)
        elif op == "prod":
            self.lo, self.hi, self.identity = 1, 2, 1
            self.window = min(nranks, max_pow2_exponent(dt))
            result = (1, 2**self.window)
        else:  # max, min, or a collective that does not reduce
            self.lo, self.hi = (0, 99) if dt.kind == "u" else (-50, 49)
            result = (self.lo, self.hi)
        # Fill for outputs before a checked call, so unwritten elements count as wrong.
        if _is_int(dt):
            self.sentinel = result[1] + 1 if result[1] < np.iinfo(dt).max else result[0] - 1
        else:
            self.sentinel = float("nan")
        # Float avg: within nranks epsilons, relative to max(|expected|, 1).
        self.tol = nranks * float(_finfo(dt).eps) if op == "avg" and not _is_int(dt) else None
        self._patterns: dict[int, np.ndarray] = {}
        self._typed: dict[int, np.ndarray] = {}
        self._reduced = None

    def pattern(self, rank: int) -> np.ndarray:
        """Rank ``rank``'s input over one period, as float64."""
        v = self._patterns.get(rank)
        if v is None:
            j = np.arange(PERIOD, dtype=np.int64)
            span = np.uint64(self.hi - self.lo + 1)
            v = (self.lo + (_mix(rank, j) % span).astype(np.int64)).astype(np.float64)
            if self.window < self.nranks:
                v[(rank - j) % self.nranks >= self.window] = self.identity
            if len(self._patterns) < 64:
                self._patterns[rank] = v
        return v

    def typed(self, rank: int) -> np.ndarray:
        t = self._typed.get(rank)
        if t is None:
            t = self._typed[rank] = self.pattern(rank).astype(self.dtype)
        return t

    def reduced(self) -> np.ndarray:
        """The op over every rank's pattern, as float64 (exact by construction)."""
        if self._reduced is None:
            combine = {"sum": np.add, "avg": np.add, "prod": np.multiply, "max": np.maximum, "min": np.minimum}[self.op]
            acc = self.pattern(0).copy()
            for r in range(1, self.nranks):
                combine(acc, self.pattern(r), out=acc)
            if self.op == "avg":
                acc /= self.nranks
                if _is_int(self.dtype):
                    np.trunc(acc, out=acc)  # NCCL: integer avg truncates toward zero
            self._reduced = acc
        return self._reduced

    def fill(self, buf: np.ndarray, rank: int, start: int = 0) -> None:
        """buf[k] = rank's input at element start + k."""
        tile_into(buf, self.typed(rank), start)

    def count_wrong(self, got: np.ndarray, ref: np.ndarray, start: int = 0) -> int:
        """Elements of ``got`` that differ from ``ref`` (one period, float64) read from
        element ``start`` on."""
        n = len(got)
        if n == 0:
            return 0
        k = start % PERIOD
        ref = np.concatenate((ref[k:], ref[:k])) if k else ref
        if self.tol is None:
            exp = ref.astype(self.dtype)
            full = n // PERIOD * PERIOD
            wrong = int(np.count_nonzero(got[:full].reshape(-1, PERIOD) != exp)) if full else 0
            return wrong + int(np.count_nonzero(got[full:] != exp[: n - full]))
        bound = self.tol * np.maximum(np.abs(ref), 1.0)
        ok = 0
        for lo in range(0, n, PERIOD):
            seg = got[lo : lo + PERIOD].astype(np.float64)
            m = len(seg)
            ok += int(np.count_nonzero(np.abs(seg - ref[:m]) <= bound[:m]))  # NaN counts as wrong
        return n - ok


def tile_into(dst: np.ndarray, period: np.ndarray, start: int = 0) -> None:
    """dst[k] = period[(start + k) % len(period)], without a full-size temporary."""
    p, n = len(period), len(dst)
    k = start % p
    if k:
        period = np.concatenate((period[k:], period[:k]))
    full = n // p * p
    if full:
        dst[:full].reshape(-1, p)[...] = period
    dst[full:] = period[: n - full]


# ---------------------------------------------------------- one timed call
REDUCED = -1  # check source: the reduction over every rank (else a rank number)


class Case:
    """One collective call at one size in one mode, with what to fill and check.

    ``run`` makes the call (arguments bound beforehand: the timed loop allocates
    nothing); ``clear`` views get the sentinel and ``inputs`` (view, start) the
    rank's own data before a checked call; ``checks`` lists (view, source, start):
    view must equal source's data (a rank, or REDUCED) from element start on.
    """

    __slots__ = ("run", "clear", "inputs", "checks")

    def __init__(self, run, clear=(), inputs=(), checks=()):
        self.run, self.clear, self.inputs, self.checks = run, list(clear), list(inputs), list(checks)


def modes(collective: str) -> tuple:
    """broadcast is always in place in uniccl: it has no out-of-place column."""
    return ("ip",) if collective == "broadcast" else ("oop", "ip")


def make_case(comm, collective, send, recv, total, count, op, root, inplace) -> Case:
    """``send``/``recv``: this dtype's buffers (at least ``total`` elements each)."""
    r, n = comm.rank, comm.size
    p = functools.partial
    if collective in ("all_reduce", "reduce"):
        src, dst = (recv[:total],) * 2 if inplace else (send[:total], recv[:total])
        if collective == "all_reduce":
            run = p(comm.all_reduce, src, None if inplace else dst, op)
        else:
            run = p(comm.reduce, src, None if inplace else dst, op, root)
        checks = [(dst, REDUCED, 0)] if collective == "all_reduce" or r == root else []
        return Case(run, [] if inplace else [dst], [(src, 0)], checks)
    if collective == "broadcast":
        buf = recv[:total]
        mine = r == root
        return Case(p(comm.broadcast, buf, root), [] if mine else [buf], [(buf, 0)] if mine else [], [(buf, root, 0)])
    if collective in ("all_gather", "gather"):
        dst = recv[:total]
        src = dst[r * count : (r + 1) * count] if inplace else send[:count]
        if collective == "all_gather":
            run, checked = p(comm.all_gather, src, dst), True
        else:
            run, checked = p(comm.gather, src, dst, root), r == root
        checks = [(dst[j * count : (j + 1) * count], j, 0) for j in range(n)] if checked else []
        return Case(run, [dst], [(src, 0)], checks)
    if collective == "all_to_all":
        src = recv[:total] if inplace else send[:total]
        dst = src if inplace else recv[:total]  # the same object means in place
        return Case(
            p(comm.all_to_all, src, dst),
            [] if inplace else [dst],
            [(src, 0)],
            [(dst[j * count : (j + 1) * count], j, r * count) for j in range(n)],
        )
    # reduce_scatter, scatter: block r of the send buffer
    src = send[:total]
    dst = src[r * count : (r + 1) * count] if inplace else recv[:count]
    if collective == "reduce_scatter":
        run, source = p(comm.reduce_scatter, src, dst, op), REDUCED
    else:
        run, source = p(comm.scatter, src, dst, root), root
    return Case(run, [] if inplace else [dst], [(src, 0)], [(dst, source, r * count)])


def prepare(case: Case, data: CheckData, rank: int) -> None:
    for view in case.clear:
        view.fill(data.sentinel)
    for view, start in case.inputs:
        data.fill(view, rank, start)


def count_wrong(case: Case, data: CheckData) -> int:
    wrong = 0
    for view, source, start in case.checks:
        ref = data.reduced() if source == REDUCED else data.pattern(source)
        wrong += data.count_wrong(view, ref, start)
    return wrong


def time_loop(comm, run, iters: int, warmup: int) -> float:
    """Seconds per call: warm up, barrier, then ``iters`` calls back to back."""
    for _ in range(warmup):
        run()
    comm.barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        run()
    return (time.perf_counter() - t0) / iters


# ------------------------------------------------------------------- table
_PREFIX = "{:>12}  {:>12}  {:>8}  {:>6}  {:>6}"
_MODE = "  {:>7}  {:>6}  {:>6}  {:>6}"


def format_time(us: float) -> str:
    """nccl-tests' precision: 2 decimals below 100 us, 1 below 10 ms, then none."""
    if us >= 10000.0:
        return f"{us:7.0f}"
    if us >= 100.0:
        return f"{us:7.1f}"
    return f"{us:7.2f}"


def header_lines() -> list:
    width = len(_PREFIX.format(*[""] * 5))
    mode_w = len(_MODE.format(*[""] * 4))
    title = "#" + " " * (width - 1) + "out-of-place".center(mode_w) + "in-place".center(mode_w)
    names = (
        _PREFIX.format("size", "count", "type", "redop", "root")
        + _MODE.format("time", "algbw", "busbw", "#wrong") * 2
        + "  algorithm"
    )
    units = _PREFIX.format("(B)", "(elements)", "", "", "") + _MODE.format("(us)", "(GB/s)", "(GB/s)", "") * 2
    return [title.rstrip(), "#" + names[1:], ("#" + units[1:]).rstrip()]


def row_path(row: dict) -> str:
    """The algorithm column: the path the row's calls took (both modes' when they differ)."""
    paths = [row.get(f"{m}_path") for m in ("oop", "ip")]
    return "/".join(dict.fromkeys(p for p in paths if p)) or "-"


def format_row(row: dict) -> str:
    """One table line from a row dict (see ``run_rows``); unmeasured columns are '-'; the
    last column, the algorithm, is left-aligned."""
    out = _PREFIX.format(
        row["size"], row["count"], row["dtype"], row["op"] or "-", "-" if row["root"] is None else row["root"]
    )
    for mode in ("oop", "ip"):
        t = row[f"{mode}_time_us"]
        if t is None:
            out += _MODE.format("-", "-", "-", "-")
            continue
        wrong = row[f"{mode}_wrong"]
        out += _MODE.format(
            format_time(t),
            f"{row[f'{mode}_algbw']:.2f}",
            f"{row[f'{mode}_busbw']:.2f}",
            "N/A" if wrong is None else wrong,
        )
    return f"{out}  {row_path(row)}"


def footer_lines(rows: list, checked: bool) -> list:
    wrong = sum(row[f"{m}_wrong"] or 0 for row in rows for m in ("oop", "ip"))
    bws = [row[f"{m}_busbw"] for row in rows for m in ("oop", "ip") if row[f"{m}_busbw"] is not None]
    status = "N/A (-c 0)" if not checked else f"{wrong} {'OK' if wrong == 0 else 'FAILED'}"
    avg = sum(bws) / len(bws) if bws else 0.0
    return [f"# Out of bounds values : {status}", f"# Avg bus bandwidth    : {avg:g} GB/s", "#"]


# ------------------------------------------------------------------ the run
class _Discard:
    """A file that keeps nothing (the table, when the JSON has stdout)."""

    @staticmethod
    def write(text: str) -> int:
        return len(text)

    @staticmethod
    def flush() -> None:
        pass


class _Progress:
    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.shown = False

    def show(self, text: str) -> None:
        if self.enabled:
            sys.stderr.write(f"\r\033[K[{text}]")
            sys.stderr.flush()
            self.shown = True

    def clear(self) -> None:
        if self.shown:
            sys.stderr.write("\r\033[K")
            sys.stderr.flush()
            self.shown = False


def last_path(comm, collective: str, nbytes: int) -> str:
    """The path the communicator's last call took, as its flight recorder has it ("shm",
    "tcp:ring", "hierarchical", ...); the tuner's choice when the recorder is off; "local"
    on one rank."""
    if comm.size < 2:
        return "local"
    from ..observability import flight as _flight

    last = getattr(comm, "last_operation", None)
    entry = last() if last is not None else None
    path = None
    if entry is not None and entry[_flight.OP] == collective:
        path = entry[_flight.PATH]
    if not path:
        tuner = getattr(comm, "tuner", None)
        if tuner is None:
            return "?"
        path = tuner.choose(collective, nbytes)
    if isinstance(path, str):
        return path
    return "shm" if path.transport == "shm" else f"{path.transport}:{path.algorithm}"


def run_rows(comm, collective: str, cfg, out, progress: _Progress, facts: dict | None = None) -> list:
    """Time (and check) every dtype/op/size of one collective; rank 0 prints rows as
    they finish.  Returns the row dicts (complete on rank 0); each carries ``facts``
    (the run's, see :func:`run_facts`) under "run"."""
    from .._types import ReduceOp

    n, rank, lead = comm.size, comm.rank, comm.rank == 0
    sizes = size_sweep(cfg.minbytes, cfg.maxbytes, cfg.stepfactor)
    ops = cfg.op if collective in REDUCING else (None,)
    root = cfg.root if collective in ROOTED else None
    factor = busbw_factor(collective, n)
    times, wrongs = np.zeros(2), np.zeros(2, np.int64)  # per mode, summed over ranks
    paths = [None, None]  # per mode: the path the timed calls took (rank 0's: the ranks agree)
    plans = {d: plan_rows(collective, sizes, numpy_dtype(d).itemsize, n) for d in cfg.datatype}
    todo = sum(len(p) for p in plans.values()) * len(ops)
    rows, done = [], 0
    for dname in cfg.datatype:
        plan = plans[dname]
        if not plan:
            continue
        dt = numpy_dtype(dname)
        most = max(total for _, total, _ in plan)
        send, recv = np.zeros(most, dt), np.zeros(most, dt)  # views of these for every row
        for opname in ops:
            op = None if opname is None else ReduceOp[opname.upper()]
            data = CheckData(dname, opname, n)
            for nbytes, total, count in plan:
                done += 1
                if lead:
                    progress.show(f"{collective} {dname} {opname or '-'} {format_size(nbytes)} {done}/{todo}")
                times[:] = 0
                wrongs[:] = 0
                paths[:] = [None, None]
                for i, mode in enumerate(("oop", "ip")):
                    if mode not in modes(collective):
                        continue
                    case = make_case(comm, collective, send, recv, total, count, op, root, mode == "ip")
                    prepare(case, data, rank)
                    times[i] = time_loop(comm, case.run, cfg.iters, cfg.warmup)
                    paths[i] = last_path(comm, collective, nbytes)
                    if cfg.check:
                        prepare(case, data, rank)
                        case.run()
                        wrongs[i] = count_wrong(case, data)
                comm.all_reduce(times)
                comm.all_reduce(wrongs)
                row = {
                    "collective": collective,
                    "size": nbytes,
                    "count": count,
                    "dtype": dname,
                    "op": opname,
                    "root": root,
                    "nranks": n,
                    "platform": comm.platform,
                }
                for i, mode in enumerate(("oop", "ip")):
                    measured = mode in modes(collective)
                    sec = times[i] / n  # mean over ranks, like nccl-tests
                    algbw = nbytes / sec / 1e9 if measured and sec > 0 else 0.0
                    row[f"{mode}_time_us"] = sec * 1e6 if measured else None
                    row[f"{mode}_algbw"] = algbw if measured else None
                    row[f"{mode}_busbw"] = algbw * factor if measured else None
                    row[f"{mode}_wrong"] = int(wrongs[i]) if measured and cfg.check else None
                    row[f"{mode}_path"] = paths[i]
                if facts is not None:
                    row["run"] = facts
                rows.append(row)
                if lead:
                    progress.clear()
                    print(format_row(row), file=out, flush=True)
    return rows


_RANK_INFO_BYTES = 1024  # one rank's self-description in the header's all_gather
_MPI_LAUNCHER_VARS = ("PMI_RANK", "PMI_SIZE", "PMIX_RANK", "OMPI_COMM_WORLD_SIZE", "MPI_LOCALNRANKS")


def gather_ranks(comm) -> list:
    """Every rank's {rank, pid, host, platform, device}, in rank order, over the
    communicator itself (an all_gather: every rank calls it; any transport)."""
    import socket

    me = {
        "rank": comm.rank,
        "pid": os.getpid(),
        "host": socket.gethostname()[:255],
        "platform": comm.platform,
        "device": getattr(comm, "device", 0),
    }
    if comm.size < 2:
        return [me]
    raw = json.dumps(me).encode()
    send = np.zeros(_RANK_INFO_BYTES, np.uint8)
    send[: len(raw)] = np.frombuffer(raw, np.uint8)
    recv = np.zeros(_RANK_INFO_BYTES * comm.size, np.uint8)
    comm.all_gather(send, recv)
    return [json.loads(bytes(block).rstrip(b"\0")) for block in recv.reshape(comm.size, -1)]


def launcher_name() -> str:
    """What started this process: "uniccl run" (its rendezvous), "mpiexec" (an MPI launcher) or "none"."""
    if any(v in os.environ for v in _MPI_LAUNCHER_VARS):
        return "mpiexec"
    return "uniccl run" if "UNICCL_RENDEZVOUS" in os.environ else "none"


def transport_facts(comm) -> dict:
    """How the ranks talk: the data transport the tuner chose and why, how they met
    (bootstrap "tcp" or "mpi") and, only when MPI is in use, which MPI."""
    tuner = getattr(comm, "tuner", None)
    boot = getattr(comm, "bootstrap", None)
    info = {
        "transport": getattr(tuner, "transport", None) or comm.stats().get("transport"),
        "transport_why": getattr(tuner, "transport_why", None),
        "bootstrap": boot,
        "launcher": launcher_name(),
        "mpi": None,
    }
    if boot == "mpi":
        try:
            from ..transport.mpi import library

            lib = library()
            info["mpi"] = f"{lib['name']} {lib['version']} (MPI {lib['standard']})"
        except Exception as exc:  # the MPI name is decoration
            info["mpi"] = f"unknown ({exc})"
    return info


def source_commit(package_dir: str | None = None) -> str | None:
    """The git commit uniccl was built from: the package's own record when it has one, else
    ``git rev-parse HEAD`` when the package is imported from a checkout (its files tracked
    there); None otherwise (an installed wheel: the checkout around a venv says nothing)."""
    from .. import _version

    stamped = getattr(_version, "__commit__", None)
    if stamped:
        return str(stamped)
    here = package_dir or os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # uniccl/
    try:
        tracked = subprocess.run(
            ["git", "-C", here, "ls-files", "--error-unmatch", "__init__.py"],
            capture_output=True,
            text=True,
            timeout=10,
        )
        if tracked.returncode != 0:
            return None
        head = subprocess.run(["git", "-C", here, "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    commit = head.stdout.strip()
    return commit if head.returncode == 0 and re.fullmatch(r"[0-9a-f]{40}", commit) else None


def command_line(argv=None) -> str:
    """This process's command line (``sys.argv``), the entry point written ``uniccl``."""
    argv = list(sys.argv if argv is None else argv) or ["uniccl"]
    if os.path.basename(argv[0]) in ("uniccl", "__main__.py", "cli.py"):
        argv[0] = "uniccl"
    return shlex.join(argv)


def run_facts(comm, ranks: list, info: dict, command: str | None = None) -> dict:
    """The run's facts, carried by every JSON row: uniccl version, commit (None: unknown),
    transport, ranks, hosts, date (ISO 8601, UTC) and command line (``command``: the user's,
    given to -np's relaunched ranks; else this process's)."""
    from .._version import __version__

    return {
        "uniccl": __version__,
        "commit": source_commit(),
        "transport": info["transport"],
        "transport_why": info["transport_why"],
        "bootstrap": info["bootstrap"],
        "launcher": info["launcher"],
        "mpi": info["mpi"],
        "platform": comm.platform,
        "ranks": comm.size,
        "hosts": list(dict.fromkeys(r["host"] for r in ranks)),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "command": command or command_line(),
    }


def _preamble(comm, cfg) -> tuple:
    """('#' lines naming the job: every rank's host, pid and device, the transport, the MPI
    only where one is in use; the run's facts), on rank 0; ([], None) elsewhere (collective)."""
    from .._version import __version__

    ranks = gather_ranks(comm)
    if comm.rank != 0:
        return [], None
    info = transport_facts(comm)
    facts = run_facts(comm, ranks, info, getattr(cfg, "run_command", None))
    hosts = facts["hosts"]
    why = f" ({info['transport_why']})" if info["transport_why"] else ""
    if comm.size < 2:
        met = "one process" + (" (an MPI singleton)" if info["bootstrap"] == "mpi" else "")
    else:
        met = {"tcp": "ranks met over TCP", "mpi": "ranks met over MPI"}.get(
            info["bootstrap"], f"bootstrap {info['bootstrap']}"
        )
        met += {"uniccl run": " (started by uniccl run)", "mpiexec": " (started by an MPI launcher)", "none": ""}[
            info["launcher"]
        ]
    lines = [
        f"# uniccl {__version__} bench: nranks {comm.size} on {len(hosts)} host{'s' * (len(hosts) != 1)}  "
        f"platform {comm.platform}  transport {info['transport']}{why}",
        f"#  {met}"
        + (f"; MPI {info['mpi']}" if info["mpi"] else "")
        + f"; commit {facts['commit'] or 'unknown'}; {facts['date']}",
        f"#  sizes {format_size(cfg.minbytes)}..{format_size(cfg.maxbytes)} x{cfg.stepfactor}  "
        f"iters {cfg.iters}  warmup {cfg.warmup}  check {cfg.check}",
        f"#  time: mean of {cfg.iters} back-to-back calls after a barrier, averaged over ranks "
        "(nccl-tests' method); algbw = size/time, busbw = algbw x bus factor (GB/s = 1e9 B/s)",
        "#  size: per-rank total buffer; count: the call's count argument (elements per block for split buffers)",
        "#  algorithm: the path the size's calls took (transport:algorithm; shm: the shared-memory engine)",
        "#",
    ]
    lines += [
        f"#  Rank {r['rank']:3d} Pid {r['pid']:7d} on {r['host']:>12} device {r['device']:2d} [{r['platform']}]"
        for r in ranks
    ]
    return lines + ["#"], facts


def _collective_header(collective, comm, cfg) -> list:
    reducing, rooted = collective in REDUCING, collective in ROOTED
    return [
        f"# Collective: {collective}  nranks {comm.size}  platform {comm.platform}",
        f"#  dtypes {','.join(cfg.datatype)}  ops {','.join(cfg.op) if reducing else '-'}  "
        f"root {cfg.root if rooted else '-'}  busbw factor {busbw_factor(collective, comm.size):g}",
        "#",
    ] + header_lines()


def run(comm, cfg, out=None) -> int:
    """The whole benchmark on an initialised communicator; returns the exit code.  The
    table goes to ``out`` (default stdout); with ``--json -`` the JSON goes to stdout
    instead of the table (``uniccl run`` merges its ranks' stderr into stdout: only one
    of the two can be there and still be parsed)."""
    to_stdout = getattr(cfg, "json", None) == "-"
    out = out or (_Discard() if to_stdout else sys.stdout)
    lead = comm.rank == 0
    collectives = COLLECTIVES if cfg.collective == "all" else (cfg.collective,)
    if cfg.root >= comm.size and any(c in ROOTED for c in collectives):
        if lead:
            print(f"uniccl bench: error: root {cfg.root} is not a rank of {comm.size}", file=sys.stderr)
        return 2
    progress = _Progress(lead and (cfg.progress or sys.stderr.isatty()))
    lines, facts = _preamble(comm, cfg)
    for line in lines:
        print(line, file=out)
    all_rows, total_wrong = [], 0
    for collective in collectives:
        if lead:
            print("\n".join(_collective_header(collective, comm, cfg)), file=out, flush=True)
        rows = run_rows(comm, collective, cfg, out, progress, facts)
        total_wrong += sum(r[f"{m}_wrong"] or 0 for r in rows for m in ("oop", "ip"))
        all_rows += rows
        if lead:
            print("\n".join(footer_lines(rows, bool(cfg.check))), file=out, flush=True)
    if lead and len(collectives) > 1:
        print(
            f"# Total out of bounds values : {total_wrong} {'OK' if total_wrong == 0 else 'FAILED'}",
            file=out,
            flush=True,
        )
    if lead and cfg.json:
        if to_stdout:
            json.dump(all_rows, sys.stdout, indent=1)
            sys.stdout.write("\n")
            sys.stdout.flush()
        else:
            with open(cfg.json, "w") as f:
                json.dump(all_rows, f, indent=1)
    return 1 if total_wrong else 0


# --------------------------------------------------------------- launching
def _env_int(names):
    for name in names:
        value = os.environ.get(name, "").strip()
        if value.isdigit():
            return int(value)
    return None


def find_mpiexec():
    """mpiexec next to this interpreter (a venv's bin, e.g. the mpich wheel's), else on PATH."""
    here = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    if os.path.isfile(here) and os.access(here, os.X_OK):
        return here
    return shutil.which("mpiexec") or shutil.which("mpirun")


def is_open_mpi(mpiexec: str) -> bool:
    try:
        res = subprocess.run([mpiexec, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    text = (res.stdout + res.stderr).lower()
    return any(key in text for key in ("open mpi", "openrte", "prterun", "prrte"))


def child_argv(args, command: str | None = None) -> list:
    """The bench arguments again, without -np (for the relaunched ranks); ``command``: the
    user's command line, for the JSON's facts."""
    argv = [
        *([args.collective] if args.collective else []),
        *(["--fit-model", os.path.abspath(args.fit_model)] if args.fit_model else []),
        "-b",
        str(args.minbytes),
        "-e",
        str(args.maxbytes),
        "-f",
        str(args.stepfactor),
        "-n",
        str(args.iters),
        "-w",
        str(args.warmup),
        "-c",
        str(args.check),
        "-d",
        ",".join(args.datatype),
        "-o",
        ",".join(args.op),
        "-r",
        str(args.root),
    ]
    if args.json:
        argv += ["--json", args.json if args.json == "-" else os.path.abspath(args.json)]
    if args.progress or sys.stderr.isatty():  # the ranks' stderr is a pipe: ask for it
        argv.append("--progress")
    command = command or getattr(args, "run_command", None)
    if command:
        argv += ["--run-command", command]
    return argv


LINGER_S = 5.0  # how long a rank that is not rank 0 waits, after an error every rank found, for rank 0 to say it


def say_once(text: str) -> int:
    """An error every rank finds alike (an argument, the environment): rank 0 (or a process
    that is not one of several ranks) says it in one line on stderr; the others say nothing
    and wait a little (LINGER_S) so that rank 0's line, not their silent exit, is what the
    launcher reports when it stops the job.  Returns the exit code, 2."""
    rank = _env_int(_LAUNCHER_RANK_VARS)
    if rank in (None, 0):
        print(f"uniccl bench: error: {text}", file=sys.stderr, flush=True)
        return 2
    try:
        time.sleep(LINGER_S)
    except KeyboardInterrupt:  # the launcher stops the job (SIGINT first): that was the point
        pass
    return 2


def relaunch(args):
    """Run the benchmark as ``args.np`` ranks: under mpiexec, or ``uniccl run``'s local
    launcher when there is no mpiexec; None when this process should just run (already
    one of them, or -np 1 without a launcher)."""
    launched = _env_int(_LAUNCHER_SIZE_VARS)
    if launched is not None or os.environ.get(_CHILD_MARK):
        if launched is not None and launched != args.np:
            return say_once(
                f"-np {args.np}, but this job already has {launched} ranks (drop -np, or start {args.np} ranks)"
            )
        return None
    if args.np == 1:
        return None
    env = dict(os.environ, **{_CHILD_MARK: "1"})
    mpiexec = find_mpiexec()
    if mpiexec is None:  # no MPI: uniccl's own launcher (TCP rendezvous, shared memory within the host)
        cmd = [sys.executable, "-m", "uniccl", "run", "--no-prefix", "-n", str(args.np)]
    else:
        cmd = [mpiexec, "-n", str(args.np)]
        if is_open_mpi(mpiexec):
            cmd.append("--oversubscribe")
            if hasattr(os, "geteuid") and os.geteuid() == 0:
                cmd.append("--allow-run-as-root")
                env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
                env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    cmd += [sys.executable, "-m", "uniccl", "bench", *child_argv(args, command_line())]
    rc = subprocess.call(cmd, env=env)
    return rc if rc >= 0 else 128 - rc  # killed by a signal: shell convention


def _same_everywhere(exc) -> bool:
    """An init error every rank meets alike: a bad or impossible UNICCL_* setting."""
    from .._errors import InvalidArgument

    return isinstance(exc, InvalidArgument) and str(exc.argument or "").startswith("UNICCL_")


def _init_error_text(exc) -> str:
    text = getattr(exc, "message", "") or str(exc)
    if getattr(exc, "argument", None) == "UNICCL_TRANSPORT" and "=mpi" in text:
        text += "; the MPI transport needs ranks started by mpiexec (or uniccl run --launcher mpi)"
    return text


def _error_name(exc) -> str:
    cls = type(exc)
    return cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"


def _take_down(comm, reason: str) -> None:
    """Peers may be waiting for this rank in a collective: end the job's waits."""
    if comm.size < 2:
        return
    if getattr(comm, "bootstrap", None) == "mpi":
        from ..transport.mpi import mpi

        mpi().COMM_WORLD.Abort(1)  # MPI's own waits cannot be cancelled otherwise
    comm.abort(reason)  # over TCP/shm: every peer's wait ends with RemoteError naming this rank


def main(args) -> int:
    try:
        size_sweep(args.minbytes, args.maxbytes, args.stepfactor)
    except ValueError as exc:
        print(f"uniccl bench: error: {exc}", file=sys.stderr)
        return 2
    if (args.collective is None) == (args.fit_model is None):
        print("uniccl bench: error: give a collective, or --fit-model FILE (not both)", file=sys.stderr)
        return 2
    if args.np is not None:
        rc = relaunch(args)
        if rc is not None:
            return rc
    from .._errors import UnicclError
    from ..comm.world import init

    try:
        comm = init()
    except KeyboardInterrupt:  # the job is being stopped (a peer failed, Ctrl-C): no traceback per rank
        return 130
    except UnicclError as exc:
        if _same_everywhere(exc):
            return say_once(_init_error_text(exc))
        rank = _env_int(_LAUNCHER_RANK_VARS)
        where = "" if rank is None else f"rank {rank}: "
        print(f"uniccl bench: {where}error: {_error_name(exc)}: {exc}", file=sys.stderr, flush=True)
        return 2
    try:
        if args.fit_model:
            sizes = size_sweep(args.minbytes, args.maxbytes, args.stepfactor)
            command = getattr(args, "run_command", None) or command_line()
            return fit_model(comm, sizes, args.iters, args.warmup, args.fit_model, command, sys.stdout)
        return run(comm, args)
    except KeyboardInterrupt:
        if comm.rank == 0:
            print("uniccl bench: interrupted", file=sys.stderr, flush=True)
        return 130
    except UnicclError as exc:  # a peer's failure, a timeout: one line, the cause is named in it
        sys.stderr.write(f"uniccl bench: rank {comm.rank} failed: {_error_name(exc)}: {exc}\n")
        sys.stderr.flush()
        _take_down(comm, f"uniccl bench: {_error_name(exc)}")
        return 1
    except Exception:
        sys.stderr.write(f"uniccl bench: rank {comm.rank} failed:\n{traceback.format_exc()}")
        sys.stderr.flush()
        _take_down(comm, "uniccl bench failed")
        return 1
    finally:
        comm.destroy()
