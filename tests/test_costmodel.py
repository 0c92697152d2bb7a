"""uniccl.comm.costmodel against hand computations and step-by-step simulations of the schedules,
and the tuner's cost_all_reduce against the formulas it had before they moved there."""

import json
import math

import pytest

from uniccl.comm import costmodel as cm
from uniccl.comm import tuner

# Test constants, distinct enough that a swapped or dropped term changes the result.
A, B, G = 3e-6, 7e-11, 1.3e-10
LA, LB = 0.5e-6, 5e-11  # shared memory: the hierarchical model's defaults
MIB = 1 << 20


def close(x):
    return pytest.approx(x, rel=1e-12, abs=0)


# ------------------------------------------------------------------------------------ ring
def test_ring_closed_forms():
    # 2(n-1) alpha + 2(n-1)/n m beta + (n-1)/n m gamma, worked out by hand
    assert cm.ring(MIB, 4, A, B, G) == close(2.3033664e-4)  # 1.8e-5 + 1.1010048e-4 + 1.0223616e-4
    assert cm.ring(8, 2, A, B, G) == close(6.00108e-6)  # 6e-6 + 5.6e-10 + 5.2e-10
    assert cm.ring(0, 16384, A, B, G) == close(0.098298)  # 32766 messages of nothing
    assert cm.ring(123, 1, A, B, G) == 0


def simulate_ring(n, count, itemsize=4):
    """Run the ring schedule (reduce-scatter then all-gather, segment i of count/n elements) on
    integer data, step by step; return the per-rank totals and the time, each step lasting as
    long as its slowest rank (alpha per message received, beta per byte received, gamma per byte
    reduced)."""
    assert count % n == 0
    seg = count // n
    data = [[(r + 1) * 1000 + i for i in range(count)] for r in range(n)]
    want = [sum(d[i] for d in data) for i in range(count)]
    sent_msgs, sent_bytes, recv_bytes = [0] * n, [0] * n, [0] * n
    elapsed = 0.0
    for phase in ("reduce_scatter", "all_gather"):
        for s in range(n - 1):
            step = [0.0] * n
            snapshot = [list(d) for d in data]  # every rank sends what it held at the step's start
            for r in range(n):
                left = (r - 1) % n
                if phase == "reduce_scatter":
                    i = (r - s - 1) % n  # the segment rank `left` sends: (left - s) % n
                else:
                    i = (r - s) % n
                lo, hi = i * seg, (i + 1) * seg
                incoming = snapshot[left][lo:hi]
                if phase == "reduce_scatter":
                    data[r][lo:hi] = [a + b for a, b in zip(data[r][lo:hi], incoming)]
                else:
                    data[r][lo:hi] = incoming
                nb = seg * itemsize
                sent_msgs[left] += 1
                sent_bytes[left] += nb
                recv_bytes[r] += nb
                step[r] = A + nb * B + (nb * G if phase == "reduce_scatter" else 0.0)
            elapsed += max(step)
    assert all(d == want for d in data), "the schedule is not an all_reduce"
    return sent_msgs, sent_bytes, recv_bytes, elapsed


@pytest.mark.parametrize("n", [2, 3, 4, 5, 8, 16])
def test_ring_matches_its_schedule_step_by_step(n):
    count = 6 * n
    nbytes = 4 * count
    msgs, sent, recv, elapsed = simulate_ring(n, count)
    assert msgs == [2 * (n - 1)] * n
    assert sent == recv == [2 * (n - 1) * nbytes // n] * n
    assert cm.ring(nbytes, n, A, B, G) == close(elapsed)


# ------------------------------------------------------------------------ recursive doubling
def simulate_recursive_doubling(n):
    """algorithms.all_reduce_recursive_doubling's schedule on integer data: the message rounds on
    its critical path (a rank that folds into its neighbour waits for the rounds in between)."""
    data = [[r + 1, 10 * (r + 1)] for r in range(n)]
    want = [sum(d[i] for d in data) for i in range(2)]
    p = 1 << (n.bit_length() - 1)
    rem = n - p
    rounds = 0
    if rem:  # ranks 0, 2, ... 2(rem-1) hand their data to their odd neighbour
        for r in range(0, 2 * rem, 2):
            data[r + 1] = [a + b for a, b in zip(data[r + 1], data[r])]
        rounds += 1
    active = [r for r in range(n) if not (r < 2 * rem and r % 2 == 0)]
    assert len(active) == p
    mask = 1
    while mask < p:
        snapshot = {r: list(data[r]) for r in active}
        for vr, r in enumerate(active):
            peer = active[vr ^ mask]
            data[r] = [a + b for a, b in zip(snapshot[r], snapshot[peer])]
        rounds += 1
        mask <<= 1
    if rem:  # and get the result back
        for r in range(0, 2 * rem, 2):
            data[r] = list(data[r + 1])
        rounds += 1
    assert all(d == want for d in data), "the schedule is not an all_reduce"
    return rounds


@pytest.mark.parametrize("n", [1, 2, 4, 8, 64, 1024])
def test_recursive_doubling_power_of_two(n):
    m = 12345
    rounds = simulate_recursive_doubling(n)
    assert rounds == int(math.log2(n))
    assert cm.recursive_doubling(m, n, A, B, G) == close(rounds * (A + m * B + m * G))


@pytest.mark.parametrize("n", [3, 5, 6, 7, 12, 1000])
def test_recursive_doubling_not_a_power_of_two_charges_one_round_more_than_the_schedule(n):
    # The tuner's formula, kept so its choices stay the same: ceil(log2 n) + 2 rounds of the whole
    # buffer, where the schedule takes floor(log2 n) + 2 (tuner.py's history; costmodel's docstring).
    m = 4096
    per_round = A + m * (B + G)
    assert cm.recursive_doubling(m, n, A, B, G) == close((math.ceil(math.log2(n)) + 2) * per_round)
    assert simulate_recursive_doubling(n) == math.floor(math.log2(n)) + 2
    assert cm.recursive_doubling(m, n, A, B, G) == close((simulate_recursive_doubling(n) + 1) * per_round)


# ------------------------------------------------------------------------------ binary tree
def simulate_tree(n, m):
    """Heap-ordered binary tree (children of r: 2r+1, 2r+2), reduce to rank 0 then broadcast,
    level by level; a parent takes its children's messages one after another."""
    depth = {0: 0}
    for r in range(1, n):
        depth[r] = depth[(r - 1) // 2] + 1
    data = {r: r + 1 for r in range(n)}
    levels = max(depth.values())
    elapsed = 0.0
    for level in range(levels, 0, -1):  # up
        fan = {}
        for r in (r for r in range(n) if depth[r] == level):
            parent = (r - 1) // 2
            data[parent] += data[r]
            fan[parent] = fan.get(parent, 0) + 1
        elapsed += max(fan.values()) * (A + m * B + m * G)
    for level in range(1, levels + 1):  # down
        fan = {}
        for r in (r for r in range(n) if depth[r] == level):
            parent = (r - 1) // 2
            data[r] = data[parent]
            fan[parent] = fan.get(parent, 0) + 1
        elapsed += max(fan.values()) * (A + m * B)
    assert set(data.values()) == {n * (n + 1) // 2}
    return elapsed


@pytest.mark.parametrize("n", list(range(1, 40)) + [64, 100, 127, 128, 129, 1024])
def test_tree_matches_its_schedule_level_by_level(n):
    m = 1000
    want = simulate_tree(n, m) if n > 1 else 0.0
    assert cm.tree(m, n, A, B, G) == close(want)


def test_tree_closed_forms():
    m = 1000
    unit = 2 * A + 2 * m * B + m * G  # one child up and down: 6.27e-6
    assert cm.tree(m, 2, A, B, G) == close(6.27e-6)
    assert cm.tree(m, 3, A, B, G) == close(2 * 6.27e-6)  # the root has two children
    assert cm.tree(m, 16, A, B, G) == close(4.389e-5)  # 2+2+2 children on three levels, 1 on the last
    assert cm.tree(m, 15, A, B, G) == close(6 * unit)  # a full tree: two children on each of 3 levels


# ------------------------------------------------------------------------ double binary tree
def test_double_binary_tree_small_message_is_one_chunk_through_2_log2_n_stages():
    # 8 B cannot be cut: k = 1, 2 ceil(log2 n) stages of (alpha + the whole message's work)
    work = 2 * 1023 / 1024 * 8 * B + 1023 / 1024 * 8 * G  # 1.11890625e-9 + 1.038984375e-9
    assert work == close(2.157890625e-9)
    assert cm.double_binary_tree(8, 1024, A, B, G) == close(20 * (A + 2.157890625e-9))
    assert cm.double_binary_tree(0, 16384, A, B, G) == close(28 * A)
    assert cm.double_binary_tree(0, 1000, A, B, G) == close(20 * A)  # ceil(log2 1000) = 10
    assert cm.double_binary_tree(0, 1025, A, B, G) == close(22 * A)
    assert cm.double_binary_tree(0, 2, A, B, G) == close(2 * A)
    assert cm.double_binary_tree(MIB, 1, A, B, G) == 0


@pytest.mark.parametrize("n", [2, 3, 64, 1000, 1024, 16384])
@pytest.mark.parametrize("m", [8192, 100_000, MIB, 256 * MIB])
def test_double_binary_tree_chunk_count_is_the_best_one(n, m):
    # every chunk count from 1 to the most that keeps chunks >= MIN_CHUNK bytes per tree, tried
    depth = math.ceil(math.log2(n))
    work = 2 * (n - 1) / n * m * B + (n - 1) / n * m * G
    k_max = max(1, m // (2 * cm.MIN_CHUNK))
    best = min((2 * depth + k - 1) * (A + work / k) for k in range(1, k_max + 1))
    assert cm.double_binary_tree(m, n, A, B, G) == close(best)


def test_double_binary_tree_has_the_rings_bandwidth_and_logarithmic_latency():
    n, m = 1024, 1 << 40
    bandwidth = 2 * (n - 1) / n * m * B + (n - 1) / n * m * G  # the ring's, without its 2(n-1) alpha
    assert cm.ring(m, n, A, B, G) == close(2 * (n - 1) * A + bandwidth)
    assert 1 < cm.double_binary_tree(m, n, A, B, G) / bandwidth < 1.01
    # latency: 16x the ranks add 8 stages, not 16x the messages
    assert cm.double_binary_tree(0, 16384, A, B, G) - cm.double_binary_tree(0, 1024, A, B, G) == close(8 * A)


def test_pipeline_limits():
    assert cm.pipeline(1, A, 1.0, 1000) == close(A + 1.0)  # one stage: cutting only adds messages
    assert cm.pipeline(5, A, 1.0, 1) == close(5 * (A + 1.0))  # one chunk: store and forward
    assert cm.pipeline(5, 0.0, 1.0, 64) == close(68 / 64)  # no latency: the most chunks


# ------------------------------------------------------------------------------ hierarchical
def test_hierarchical_small_message_binomial_on_the_host_ring_between_two():
    # n = 16, 8 per host: reduce 3 x (LA + 8 LB + 8 G), ring over 2 leaders, broadcast 3 x (LA + 8 LB)
    reduce = 3 * (0.5e-6 + 4e-10 + 1.04e-9)  # 1.50432e-6
    between = 2 * A + 8 * B + 4 * G  # 6.00108e-6
    bcast = 3 * (0.5e-6 + 4e-10)  # 1.5012e-6
    assert reduce + between + bcast == close(9.0066e-6)
    assert cm.hierarchical(8, 16, A, B, G) == close(9.0066e-6)


def test_hierarchical_large_message_reduce_scatter_gather_on_the_host():
    m, g = 64 * MIB, 8
    reduce = 2 * (g - 1) * LA + 2 * (g - 1) / g * m * LB + (g - 1) / g * m * G
    bcast = 2 * (g - 1) * LA + 2 * (g - 1) / g * m * LB
    assert reduce < 3 * (LA + m * LB + m * G) and bcast < 3 * (LA + m * LB)  # cheaper than binomial here
    between = 2 * 3 * A + 2 * 3 / 4 * m * B + 3 / 4 * m * G  # ring over 4 hosts
    assert cm.hierarchical(m, 32, A, B, G) == close(reduce + between + bcast)


def test_hierarchical_composition():
    m = MIB
    local = cm.hierarchical(m, 8, A, B, G)  # one host: no network at all
    assert cm.hierarchical(m, 8, 1.0, 1.0, G) == local
    with_dbt = cm.hierarchical(m, 8192, A, B, G, inter="double_binary_tree")
    assert with_dbt - local == pytest.approx(cm.double_binary_tree(m, 1024, A, B, G), rel=1e-9)
    with_ring = cm.hierarchical(m, 8192, A, B, G, inter="ring")
    assert with_ring - local == pytest.approx(cm.ring(m, 1024, A, B, G), rel=1e-9)
    assert cm.hierarchical(m, 12, A, B, G, ranks_per_host=4) - cm.hierarchical(
        m, 4, A, B, G, ranks_per_host=4
    ) == pytest.approx(cm.ring(m, 3, A, B, G), rel=1e-9)
    assert cm.hierarchical(m, 64, A, B, G, ranks_per_host=1) == close(cm.ring(m, 64, A, B, G))
    with pytest.raises(ValueError, match="inter"):
        cm.hierarchical(m, 64, A, B, G, inter="butterfly")


def test_ring_all_gather_and_reduce_scatter_closed_forms():
    m = 6 * MIB  # the whole result (all_gather) or each rank's whole input (reduce_scatter)
    assert cm.ring_all_gather(m, 6, A, B) == close(5 * (A + m / 6 * B))
    assert cm.ring_reduce_scatter(m, 6, A, B, G) == close(5 * (A + m / 6 * (B + G)))
    assert cm.ring_all_gather(m, 1, A, B) == cm.ring_reduce_scatter(m, 1, A, B, G) == 0.0


def test_by_host_all_gather_and_reduce_scatter_step_by_step():
    # 6 ranks, 2 per host: 3 leaders; blocks of m / 6
    m, g = 6 * MIB, 2
    gather = (g - 1) * (LA + m / 6 * LB)
    bcast = min(1 * (LA + m * LB), cm.ring(m, g, LA, LB, 0.0))
    between = 2 * (A + m / 3 * B)  # the leaders' ring: 2 steps of a host's 2 blocks
    assert cm.hierarchical_all_gather(m, 6, A, B, g) == close(gather + between + bcast)
    reduce = min(1 * (LA + m * LB + m * G), cm.ring(m, g, LA, LB, G))
    between = 2 * (A + m / 3 * (B + G))
    scatter = (g - 1) * (LA + m / 6 * LB)
    assert cm.hierarchical_reduce_scatter(m, 6, A, B, G, g) == close(reduce + between + scatter)
    # one rank per host: the flat ring plus nothing
    assert cm.hierarchical_all_gather(m, 6, A, B, 1) == close(cm.ring_all_gather(m, 6, A, B))


# ------------------------------------------------------------------------------------ tuner
def legacy_cost_all_reduce(algorithm, nbytes, n):
    """tuner.cost_all_reduce as it was before the formulas moved to costmodel (verbatim)."""
    alpha, beta, gamma = tuner.ALPHA, tuner.BETA, tuner.GAMMA
    if algorithm == "recursive_doubling":
        steps = math.ceil(math.log2(n)) + (2 if n & (n - 1) else 0)
        return steps * (alpha + nbytes * (beta + gamma))
    return 2 * (n - 1) * alpha + 2 * (n - 1) / n * nbytes * beta + (n - 1) / n * nbytes * gamma


def test_tuner_cost_all_reduce_is_unchanged():
    assert (tuner.ALPHA, tuner.BETA, tuner.GAMMA) == (6e-6, 1 / 4e9, 1 / 12e9)
    sizes = [0, 1, 8, 1000, 4096, 65535, 65536, MIB - 1, MIB, 7 << 20, 1 << 30, (1 << 40) + 3]
    for n in list(range(1, 70)) + [127, 128, 129, 1000, 1024, 4097, 16384, 1 << 20]:
        for m in sizes:
            for algo in ("ring", "recursive_doubling", "anything else"):
                assert tuner.cost_all_reduce(algo, m, n) == legacy_cost_all_reduce(algo, m, n), (algo, m, n)


def test_tuner_choices_unchanged(monkeypatch):
    monkeypatch.delenv("UNICCL_ALGO", raising=False)
    monkeypatch.delenv("UNICCL_TRANSPORT", raising=False)
    for n in (2, 3, 8, 100, 1024):
        t = tuner.Tuner(n, "tcp", shm_ready=False, shm_reason="ranks span hosts")
        for m in (8, 4096, MIB, 64 * MIB):
            want = min(("ring", "recursive_doubling"), key=lambda a: legacy_cost_all_reduce(a, m, n))
            assert t.choose("all_reduce", m).algorithm == want, (n, m)


# ------------------------------------------------------------------------------ table files
def test_table_round_trip(tmp_path):
    path = tmp_path / "table.json"
    cm.write_table(path, 2.5e-6, 1 / 3e9, 1e-10, notes={"host": "ref", "command": "x"})
    raw = json.loads(path.read_text())
    assert raw == {
        "alpha_s": 2.5e-6,
        "beta_s_per_byte": 1 / 3e9,
        "gamma_s_per_byte": 1e-10,
        "host": "ref",
        "command": "x",
    }
    assert cm.load_table(path) == (2.5e-6, 1 / 3e9, 1e-10)
    assert list(tmp_path.iterdir()) == [path]  # no temporary left behind
    path.write_text('{"alpha_s": 1e-6, "beta_s_per_byte": 2e-10}')
    t = cm.load_table(path)
    assert (t.alpha, t.beta, t.gamma) == (1e-6, 2e-10, None)


@pytest.mark.parametrize(
    "text, message",
    [
        ('{"beta_s_per_byte": 1e-10}', "missing 'alpha_s'"),
        ('{"alpha_s": -1, "beta_s_per_byte": 1e-10}', "'alpha_s' must be"),
        ('{"alpha_s": 1e-6, "beta_s_per_byte": "fast"}', "'beta_s_per_byte' must be"),
        ('{"alpha_s": true, "beta_s_per_byte": 1e-10}', "'alpha_s' must be"),
        ('{"alpha_s": 1e-6, "beta_s_per_byte": 1e-10, "gamma_s_per_byte": NaN}', "'gamma_s_per_byte' must be"),
        ("[1, 2]", "expected a JSON object"),
        ("{", "not JSON"),
    ],
)
def test_load_table_refuses_bad_files(tmp_path, text, message):
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(ValueError, match=message) as e:
        cm.load_table(path)
    assert str(path) in str(e.value)


def test_write_table_refuses_what_load_table_would():
    with pytest.raises(ValueError, match="gamma"):
        cm.write_table("/nonexistent/never-written.json", 1e-6, 1e-10, float("nan"))
