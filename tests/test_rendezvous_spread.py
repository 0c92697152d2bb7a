"""The rendezvous of a TCP mesh (issue 24, item 2): rank 0 gets the table, every other rank
the entries of its neighbours in the binomial tree rooted at rank 0 only, so the server sends
O(n log n) bytes instead of n tables; the mesh then passes the table down that tree.  Every
rank also gets the fields it asks for (``every=``) of every rank at once, compactly.  The
clients here are real ``rendezvous()`` calls against a real server (threads of this process)."""

import json
import threading

import pytest

from uniccl.bootstrap.rendezvous import get_unique_id, rendezvous, tree_children, tree_parent


def payload(r: int) -> dict:
    return {"rank": r, "pad": "x" * 100, "host": f"h{r // 3}", "same": [1, True]}


def join_all(n: int, spread_of, every=()) -> list:
    uid = get_unique_id(30, host="127.0.0.1")
    out: list = [None] * n

    def one(r):
        try:
            out[r] = rendezvous(uid, r, n, payload(r), 30, spread=spread_of(r), every=every)
        except Exception as exc:  # (the test looks at it)
            out[r] = exc

    threads = [threading.Thread(target=one, args=(r,)) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return out


def parent(c: int) -> int:
    """Independently of the module: c's binary digits with the last 1 made a 0."""
    digits = bin(c)[2:]
    i = digits.rindex("1")
    return int(digits[:i] + "0" + digits[i + 1 :], 2)


def neighbours(r: int, n: int) -> set:
    return {c for c in range(1, n) if parent(c) == r} | ({parent(r)} if r else set())


@pytest.mark.parametrize("n", [2, 5, 33, 100])
def test_rank_0_gets_the_table_the_others_their_tree_neighbours(n):
    got = join_all(n, lambda r: True, every=("host", "same", "absent"))
    assert got[0].entries == [payload(p) for p in range(n)]
    sent = len(json.dumps(got[0].entries))
    for r in range(n):
        every = got[r].every
        assert every["host"] == [f"h{p // 3}" for p in range(n)], r
        assert every["same"] == [[1, True]] * n and every["absent"] == [None] * n, r
        if r == 0:
            continue
        entries = got[r].entries
        assert isinstance(entries, dict), entries
        assert set(entries) == neighbours(r, n) == {tree_parent(r), *tree_children(r, n)}, r
        assert all(entries[p] == payload(p) for p in entries)
        sent += len(json.dumps(entries))
    # every entry goes out at most 1 + (its tree degree) times: 3n entries, not n * n
    assert sent < 3 * len(json.dumps(got[0].entries)) + 64 * n


def test_every_is_one_index_when_all_ranks_agree():
    """The compact form: the distinct values once, and one index for the ranks when they agree."""
    from uniccl.bootstrap.rendezvous import _every

    table = [{"host": "a", "f": [0, False]}, {"host": "a", "f": [0, False]}, {"host": "b", "f": [0, False]}]
    assert _every(table, ["host", "f", "x"]) == {
        "host": [["a", "b"], [0, 0, 1]],
        "f": [[[0, False]], 0],
        "x": [[None], 0],
    }


def test_without_spread_every_rank_gets_the_table():
    n = 6
    got = join_all(n, lambda r: False)
    for r in range(n):
        assert got[r] == [payload(p) for p in range(n)], r


def test_ranks_that_disagree_on_spread_get_an_error():
    got = join_all(4, lambda r: r != 2)
    for r in range(4):
        assert isinstance(got[r], Exception) and "different transports" in str(got[r]), got[r]
