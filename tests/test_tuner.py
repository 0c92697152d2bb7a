"""Transport and algorithm choice: defaults, the cost model, and the environment overrides."""

import pytest

import uniccl
from uniccl.comm.tuner import Tuner, cost_all_reduce, parse_rules


def test_parse_rules():
    assert parse_rules("all_reduce:ring; broadcast:tree") == {"all_reduce": "ring", "broadcast": "tree"}
    assert parse_rules("") == {}
    with pytest.raises(uniccl.InvalidArgument, match="UNICCL_ALGO"):
        parse_rules("all_reduce")


def test_single_host_uses_shm_and_says_why(monkeypatch):
    monkeypatch.delenv("UNICCL_TRANSPORT", raising=False)
    t = Tuner(4, "mpi", shm_ready=True)
    c = t.choose("all_reduce", 1 << 20)
    assert (c.transport, c.algorithm) == ("shm", "shm")
    assert t.transport_why == "all ranks on one host"


def test_cost_model_picks_latency_then_bandwidth(monkeypatch):
    monkeypatch.delenv("UNICCL_ALGO", raising=False)
    t = Tuner(8, "tcp", shm_ready=False, shm_reason="ranks span hosts")
    small, large = t.choose("all_reduce", 8), t.choose("all_reduce", 64 << 20)
    assert small.transport == large.transport == "tcp"
    assert small.algorithm == "recursive_doubling" and large.algorithm == "ring"
    assert "cost model" in small.why
    assert cost_all_reduce("ring", 64 << 20, 8) < cost_all_reduce("recursive_doubling", 64 << 20, 8)


def test_env_overrides(monkeypatch):
    monkeypatch.setenv("UNICCL_TRANSPORT", "mpi")
    monkeypatch.setenv("UNICCL_ALGO", "all_reduce:ring")
    t = Tuner(4, "mpi", shm_ready=True)
    c = t.choose("all_reduce", 8)
    assert (c.transport, c.algorithm) == ("mpi", "ring") and "UNICCL_ALGO" in c.why
    assert t.choose("broadcast", 8) == ("mpi", "tree", t.choose("broadcast", 8).why)


def test_bad_overrides_are_typed_errors(monkeypatch):
    monkeypatch.setenv("UNICCL_TRANSPORT", "carrier-pigeon")
    with pytest.raises(uniccl.InvalidArgument, match="UNICCL_TRANSPORT"):
        Tuner(2, "mpi", True)
    monkeypatch.setenv("UNICCL_TRANSPORT", "tcp")
    with pytest.raises(uniccl.InvalidArgument, match="bootstrapped over mpi"):
        Tuner(2, "mpi", True)
    monkeypatch.setenv("UNICCL_TRANSPORT", "shm")
    with pytest.raises(uniccl.InvalidArgument, match="not usable: ranks span hosts"):
        Tuner(2, "mpi", False, "ranks span hosts")
    monkeypatch.delenv("UNICCL_TRANSPORT")
    monkeypatch.setenv("UNICCL_ALGO", "all_reduce:bogus")
    with pytest.raises(uniccl.InvalidArgument, match="unknown algorithm 'bogus'"):
        Tuner(2, "mpi", True)


def test_by_host_is_priced_and_chosen(monkeypatch):
    """Told of its hosts (comm/hosts.py), the tuner prices the by-host form (with its three more
    calls) against the flat ones: at 64 ranks on 8 hosts, 1 MiB all_reduce and small all_gather
    and reduce_scatter go by host; at 6 ranks on 3 hosts the sub-calls cost more than the 6
    network steps they save, so small calls stay flat; all_gather and reduce_scatter go by host
    only on hosts alike."""
    from uniccl.comm import costmodel, tuner

    monkeypatch.delenv("UNICCL_ALGO", raising=False)
    monkeypatch.delenv("UNICCL_TRANSPORT", raising=False)
    t = Tuner(64, "tcp", shm_ready=False, shm_reason="ranks span hosts")
    assert t.choose("all_reduce", 1 << 20).algorithm == "ring"  # not told yet
    assert t.choose("all_gather", 512).algorithm == "ring"
    t.by_host(8, True)
    mid = t.choose("all_reduce", 1 << 20)
    assert mid.algorithm == "hierarchical" and "recursive_doubling" in mid.why and "ring" in mid.why
    assert t.choose("all_gather", 512).algorithm == "hierarchical"
    assert t.choose("reduce_scatter", 512).algorithm == "hierarchical"
    a, b = tuner.ALPHA, tuner.BETA
    want = costmodel.hierarchical_all_gather(512, 64, a, b, 8) + tuner.SUB_CALLS_S
    assert f"hierarchical {want * 1e6:.1f} us" in t.choose("all_gather", 512).why
    t.by_host(9, False)  # hosts of unlike sizes
    assert t.choose("all_reduce", 1 << 20).algorithm == "hierarchical"
    assert t.choose("all_gather", 512).algorithm == "ring"
    assert t.choose("reduce_scatter", 512).algorithm == "ring"
    six = Tuner(6, "tcp", shm_ready=False, shm_reason="ranks span hosts")
    six.by_host(2, True)
    assert six.choose("all_reduce", 8).algorithm == "recursive_doubling"
    assert six.choose("all_gather", 48).algorithm == "ring"
    assert "hierarchical" in six.choose("all_gather", 48).why  # priced, not taken


def test_forced_by_host_only_where_there_are_hosts(monkeypatch):
    monkeypatch.delenv("UNICCL_TRANSPORT", raising=False)
    monkeypatch.setenv("UNICCL_ALGO", "all_reduce:hierarchical;all_gather:hierarchical")
    t = Tuner(6, "tcp", shm_ready=False, shm_reason="ranks span hosts")
    assert t.choose("all_reduce", 64 << 20).algorithm == "ring"  # no hosts told: the model's choice
    t.by_host(3, False)
    c = t.choose("all_reduce", 64 << 20)
    assert c.algorithm == "hierarchical" and "UNICCL_ALGO" in c.why
    assert t.choose("all_gather", 64 << 20).algorithm == "ring"  # unlike hosts
    one_host = Tuner(4, "tcp", shm_ready=True)
    assert one_host.choose("all_reduce", 8).algorithm == "shm"
