"""The communicator's call lock (uniccl.comm._fastpath.CallLock): threading.RLock's semantics,
held by every call.  Its owner and depth fields are the lock (every take holds the GIL), so these
check what a thread-safe lock must give: one holder at a time with the GIL handed around inside,
reentrancy, release only by the owner, a prompt hand-over to a blocked thread, and a blocked
acquire that a signal interrupts (Ctrl-C)."""

import signal
import threading
import time

import pytest

from uniccl.comm._fastpath import CallLock


def test_one_holder_at_a_time_while_the_gil_moves():
    lock, state = CallLock(), {"count": 0, "inside": 0, "most": 0}
    threads, rounds = 4, 1500

    def work():
        for _ in range(rounds):
            with lock:
                state["inside"] += 1
                state["most"] = max(state["most"], state["inside"])
                seen = state["count"]
                time.sleep(0)  # releases the GIL: another thread runs and must find the lock held
                state["count"] = seen + 1
                state["inside"] -= 1

    ts = [threading.Thread(target=work) for _ in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    assert not any(t.is_alive() for t in ts)
    assert state["most"] == 1
    assert state["count"] == threads * rounds


def test_reentrant_and_released_only_by_its_owner():
    lock = CallLock()
    with pytest.raises(RuntimeError, match="un-acquired"):
        lock.release()
    with lock:
        with lock:
            errors = []

            def other():
                try:
                    lock.release()
                except RuntimeError as exc:
                    errors.append(exc)

            t = threading.Thread(target=other)
            t.start()
            t.join(10)
            assert len(errors) == 1
        # still held once: another thread cannot take it
        got = threading.Event()
        t = threading.Thread(target=lambda: (lock.acquire(), got.set(), lock.release()))
        t.start()
        assert not got.wait(0.2)
    assert got.wait(10)  # released by the outer exit: the blocked thread takes it
    t.join(10)
    with pytest.raises(RuntimeError):
        lock.release()


def test_a_blocked_thread_takes_over_promptly():
    # a waiter blocks on the gate; a release must wake it, not leave it to its 50 ms look-again
    lock, handoffs = CallLock(), 100
    taken, go = threading.Event(), threading.Event()

    def waiter():
        for _ in range(handoffs):
            go.wait(10)
            go.clear()
            with lock:
                taken.set()

    t = threading.Thread(target=waiter)
    t.start()
    t0 = time.monotonic()
    for _ in range(handoffs):
        lock.acquire()
        go.set()
        time.sleep(0.001)  # the waiter is blocked on the held lock by now
        lock.release()
        assert taken.wait(10)
        taken.clear()
    elapsed = time.monotonic() - t0
    t.join(10)
    # 1 ms of sleep each; a hand-over left to the 50 ms timeout would take >= 5 s in all
    assert elapsed < 2.5, f"{handoffs} hand-overs took {elapsed:.2f} s"


def test_a_blocked_acquire_is_interrupted_by_a_signal():
    lock, held, done = CallLock(), threading.Event(), threading.Event()

    class Interrupted(Exception):
        pass

    def holder():
        with lock:
            held.set()
            done.wait(30)

    def on_alarm(signum, frame):
        raise Interrupted()

    old = signal.signal(signal.SIGALRM, on_alarm)
    t = threading.Thread(target=holder)
    t.start()
    try:
        assert held.wait(10)
        signal.setitimer(signal.ITIMER_REAL, 0.2)
        t0 = time.monotonic()
        with pytest.raises(Interrupted):
            lock.acquire()
        assert time.monotonic() - t0 < 5
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
        done.set()
        t.join(10)
    with lock:  # the interrupted wait left the lock usable
        pass
