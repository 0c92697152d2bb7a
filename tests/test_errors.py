"""Errors are typed, carry their context, and survive pickling (rank to rank)."""
import pickle

import pytest

import uniccl


@pytest.mark.parametrize("cls", [uniccl.InvalidArgument, uniccl.InvalidUsage, uniccl.PlatformUnavailable,
                                 uniccl.RemoteError, uniccl.Timeout, uniccl.InternalError, uniccl.VendorError])
def test_pickle_round_trip(cls):
    err = cls("too small: holds 3 elements, needs 4", op="all_reduce", rank=2, argument="recvbuf",
              code=700, status_name="cudaErrorIllegalAddress")
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
