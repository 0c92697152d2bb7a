"""Errors are typed, carry their context, and survive pickling (rank to rank)."""

import pickle

import pytest

import uniccl


@pytest.mark.parametrize(
    "cls",
    [
        uniccl.InvalidArgument,
        uniccl.InvalidUsage,
        uniccl.PlatformUnavailable,
        uniccl.RemoteError,
        uniccl.Timeout,
        uniccl.InternalError,
        uniccl.VendorError,
    ],
)
def test_pickle_round_trip(cls):
    err = cls(
        "too small: holds 3 elements, needs 4",
        op="all_reduce",
        rank=2,
        argument="recvbuf",
        code=700,
        status_name="cudaErrorIllegalAddress",
    )
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is cls
    assert str(back) == str(err)
    assert (back.op, back.rank, back.argument, back.code) == ("all_reduce", 2, "recvbuf", 700)
    assert isinstance(back, uniccl.UnicclError)


def test_message_names_operation_rank_argument():
    err = uniccl.InvalidArgument("expected float32, got float64", op="reduce", rank=1, argument="recvbuf")
    text = str(err)
    assert "reduce" in text and "rank 1" in text and "recvbuf" in text and "expected float32" in text


def test_python_base_classes():
    assert issubclass(uniccl.InvalidArgument, ValueError)
    assert issubclass(uniccl.Timeout, TimeoutError)


PUBLIC = [
    uniccl.UnicclError,
    uniccl.InvalidArgument,
    uniccl.InvalidUsage,
    uniccl.PlatformUnavailable,
    uniccl.RemoteError,
    uniccl.Timeout,
    uniccl.InternalError,
    uniccl.VendorError,
]


@pytest.mark.parametrize("cls", PUBLIC)
def test_public_name_in_tracebacks_and_repr(cls):
    import traceback

    err = cls("rank 3 failed the all_reduce", op="all_reduce", rank=0, remote_rank=3)
    assert f"{cls.__module__}.{cls.__qualname__}" == f"uniccl.{cls.__name__}"
    assert getattr(uniccl, cls.__name__) is cls  # what pickle looks the name up as
    line = traceback.format_exception_only(cls, err)[-1]
    assert line == f"uniccl.{cls.__name__}: [all_reduce, rank 0] rank 3 failed the all_reduce\n"
    assert repr(err).startswith(f"{cls.__name__}(") and "_errors" not in repr(err)


def test_uncaught_error_prints_the_public_name_and_unpickles_elsewhere():
    """A real uncaught raise prints `uniccl.RemoteError: ...`; a pickled error loads in a fresh
    interpreter that imported nothing of uniccl before (the name resolves)."""
    import subprocess
    import sys

    res = subprocess.run(
        [
            sys.executable,
            "-c",
            "import uniccl\nraise uniccl.RemoteError('rank 1 failed', op='broadcast', rank=0, remote_rank=1)",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 1
    assert res.stderr.splitlines()[-1] == "uniccl.RemoteError: [broadcast, rank 0] rank 1 failed", res.stderr
    assert "_errors" not in res.stderr.splitlines()[-1]
    blob = pickle.dumps(uniccl.Timeout("no answer", op="all_reduce", rank=2, seq=7, timeout=1.5))
    back = subprocess.run(
        [
            sys.executable,
            "-c",
            "import pickle, sys\n"
            "e = pickle.loads(sys.stdin.buffer.read())\n"
            "print(type(e).__module__, type(e).__name__, e.seq, e.timeout, isinstance(e, TimeoutError))\n"
            "print(e)",
        ],
        input=blob,
        capture_output=True,
        timeout=60,
    )
    assert back.returncode == 0, back.stderr
    assert back.stdout.decode().splitlines() == ["uniccl Timeout 7 1.5 True", "[all_reduce, rank 2] no answer"]


_TORCH_ERRORS = r"""
import torch, torch.distributed as dist
import uniccl.torch
dist.init_process_group("uniccl", store=dist.HashStore(), rank=0, world_size=1)
cases = [(torch.ones(4), dist.ReduceOp.BAND), (torch.ones(4), dist.ReduceOp.BXOR),
         (torch.ones(4, dtype=torch.bool), dist.ReduceOp.SUM),
         (torch.ones(4, dtype=torch.float8_e5m2), dist.ReduceOp.MAX)]
for t, op in cases:
    try:
        dist.all_reduce(t, op=op)
        print("no error", t.dtype, op)
    except uniccl.InvalidArgument as e:
        print(f"{type(e).__module__}.{type(e).__name__}|{e.argument}|{e.message}")
try:
    dist.broadcast(torch.ones(3, dtype=torch.bool), src=0)
except uniccl.InvalidArgument as e:
    print(f"{type(e).__module__}.{type(e).__name__}|{e.argument}|{e.message}")
dist.destroy_process_group()
"""


def test_torch_names_ops_and_dtypes():
    """torch's ReduceOp and dtype appear by name (ReduceOp.BAND, torch.bool), not as an object
    address or a DLPack code."""
    import subprocess
    import sys

    pytest.importorskip("torch")
    res = subprocess.run([sys.executable, "-c", _TORCH_ERRORS], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    from uniccl.tools.bench import DTYPES  # every dtype uniccl has

    lines, supported = [], set()
    for line in res.stdout.splitlines():
        head, sep, names = line.partition("; uniccl supports ")
        if sep:
            supported.add(frozenset(names.split(", ")))
        lines.append(head)
    assert lines == [
        "uniccl.InvalidArgument|op|torch reduce op ReduceOp.BAND is not one uniccl has (SUM, PRODUCT, MIN, MAX, AVG)",
        "uniccl.InvalidArgument|op|torch reduce op ReduceOp.BXOR is not one uniccl has (SUM, PRODUCT, MIN, MAX, AVG)",
        "uniccl.InvalidArgument|sendbuf|torch dtype torch.bool is not one uniccl has",
        "uniccl.InvalidArgument|sendbuf|torch dtype torch.float8_e5m2 is not one uniccl has",
        "uniccl.InvalidArgument|buf|torch dtype torch.bool is not one uniccl has",
    ], res.stdout
    assert supported == {frozenset(DTYPES)}
    assert "object at 0x" not in res.stdout and "DLPack" not in res.stdout
