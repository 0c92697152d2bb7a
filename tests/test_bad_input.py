"""Every bad input raises a typed error on every rank within 10 s, and no rank hangs."""

import json

import pytest
from _launch import TRANSPORTS, rank_transports, run_ranks
from workers.bad_input import CASES, NEEDS_TWO

# 12 ranks over TCP: beyond 8 (transport/tcp/transport.py's _TO_ALL_UP_TO) the records of the calls
# whose data does not carry them round go round a ring and then by dissemination, not to every rank
PAIRS = rank_transports([1, 2, 3, 4])
if any(t == "tcp" for _, t in PAIRS):
    PAIRS.append(pytest.param(12, "tcp", marks=pytest.mark.slow, id="12-tcp"))


@pytest.mark.parametrize("nranks,transport", PAIRS)
def test_bad_input_matrix(nranks, transport):
    res = run_ranks(nranks, "bad_input.py", timeout=120 if nranks <= 4 else 400, env=TRANSPORTS[transport])
    rows = [json.loads(line) for line in res.stdout.splitlines() if line.startswith("{")]
    expected_cases = set(CASES) | {"use_after_destroy"}
    if nranks == 1:
        expected_cases -= NEEDS_TWO
    seen = {(r["case"], r["rank"]) for r in rows}
    assert seen == {(c, r) for c in expected_cases for r in range(nranks)}, res.stdout[-3000:]
    bad = [r for r in rows if not r["ok"] or r.get("seconds", 0) > 10]
    assert not bad, json.dumps(bad, indent=1)
    assert res.returncode == 0, res.stdout[-3000:]
    for r in rows:  # messages name the operation and the rank
        if r["got"] and r["case"] not in ("use_after_destroy",):
            assert f"rank {r['rank']}" in r["message"], r
        if r["case"].startswith("mismatched"):  # both sides: each rank's call, on every rank
            assert "rank 0 " in r["message"] and f"but rank {nranks - 1} " in r["message"], r
