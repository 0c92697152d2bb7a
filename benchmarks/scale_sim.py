"""What a job of n ranks over uniccl's own TCP transport costs each rank, simulated on one
machine: per n, one ``uniccl run -n N -x UNICCL_TRANSPORT=tcp`` job, started as a user would
start it, whose ranks each time ``uniccl.init()``, make one all_reduce per ``--sizes`` (float32
sum, checked against numpy's float64) and then record what the process holds: its TCP sockets
(the ``socket:`` links of /proc/self/fd matched by inode against /proc/net/tcp and tcp6,
established vs listening; other sockets apart), its threads (/proc/self/status ``Threads:``; the
mesh's reader threads ``uniccl-tcp-r*`` and sender threads ``uniccl-tcp-s*`` by name) and its
memory (VmRSS, VmHWM, Pss); sockets and threads once more after a barrier.  The ranks' rows come
back as files; the driver prints a table per n -- the job's init wall (launch to the last rank's
``init()`` returning), each rank's init, sockets, threads and memory, median and max over the
ranks -- then a summary row per n, and says whether the job left anything behind (live rank
processes; new /dev/shm and /tmp entries naming a rank's pid or uniccl; stray files in the job's
status directory).  Each table names the uniccl/transport/tcp sources it ran (a SHA-256 of them).

    .venv/bin/python benchmarks/scale_sim.py [--ranks 16,32,64] [--sizes 8,1M] [--timeout 180]
                                             [--json OUT]

Every rank is its own Python process on the machine's few cores, so the table also gives apart
what precedes ``init()``: launch to the worker running, and the imports of numpy and uniccl.
One job takes about 6 s at 16 ranks, 11 s at 32, 25 s at 64 and 70 s at 128 on the 2-core
reference machine under other load.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import importlib.util
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

_TCP_STATES = {"01": "established", "0A": "listening"}


def parse_size(text: str) -> int:
    text = text.strip().upper().removesuffix("B")
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
    return int(text[:-1] if scale > 1 else text) * scale


# ------------------------------------------------------------------------------ the rank's side
def sockets() -> dict:
    """This process's sockets: TCP established, TCP listening, TCP in other states, the rest."""
    inodes, kinds = set(), Counter()
    for fd in os.listdir("/proc/self/fd"):
        try:
            link = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # the fd of listdir itself, closed meanwhile
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
        kinds[re.sub(r"\[.*", "", link) if not link.startswith("/") else "file"] += 1
    counts = {"established": 0, "listening": 0, "tcp_other": 0}
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        try:
            with open(table) as f:
                next(f)
                for line in f:
                    cols = line.split()
                    if cols[9] in inodes:
                        inodes.discard(cols[9])
                        counts[_TCP_STATES.get(cols[3], "tcp_other")] += 1
        except FileNotFoundError:  # no IPv6
            pass
    counts["other"] = len(inodes)
    counts["fds"] = sum(kinds.values())
    counts["fd_kinds"] = dict(kinds)
    return counts


def status() -> dict:
    want = {"Threads": "threads", "VmRSS": "rss_kib", "VmHWM": "hwm_kib"}
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in want:
                out[want[key]] = int(value.split()[0])
    try:
        with open("/proc/self/smaps_rollup") as f:
            out["pss_kib"] = next(int(line.split()[1]) for line in f if line.startswith("Pss:"))
    except (OSError, StopIteration):
        pass
    return out


def holdings() -> dict:
    """Sockets, threads and memory of this process now."""
    import threading

    out = sockets()
    names = [t.name for t in threading.enumerate()]  # next to Threads: (a sender may start any time)
    out.update(status())
    out["py_threads"] = len(names)
    out["readers"] = sum(
        "-poll" in n and n.startswith("uniccl-tcp-r") for n in names
    )  # (not handshakes, not link threads)
    out["senders"] = sum(n.startswith("uniccl-tcp-s") for n in names)
    kinds = Counter(re.sub(r"\d+", "N", n) for n in names)
    out["thread_kinds"] = dict(sorted(kinds.items(), key=lambda kv: -kv[1]))
    return out


def source_digest(folder: Path) -> str:
    """SHA-256 (12 hex digits) of the .py files of ``folder``: which TCP transport ran (the
    installed one, read just after the import; ranks that disagree saw it change mid-launch)."""
    digest = hashlib.sha256()
    for path in sorted(folder.glob("*.py")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:12]


def worker(folder: Path, launched: float, sizes: list[int], started: float | None = None, gate=None) -> int:
    """One rank.  ``gate`` (fork mode): (write end, read end) of the driver's pipes: a byte
    written once init() returned, then a wait for the driver's byte, sent once every rank's
    init() returned, so that no rank's calls (their connections) take the machine's few cores
    from the ranks still in init(), which a cluster's core per rank would not."""
    started = started or time.time()
    import numpy as np

    import uniccl

    imported = time.time()
    tcp_src = source_digest(Path(uniccl.__file__).parent / "transport" / "tcp")
    cpu = time.process_time()
    comm = uniccl.init()
    inited = time.time()
    if gate is not None:
        os.write(gate[0], b"i")
        _read_exact(gate[1], 1)
    row = {"rank": comm.rank, "pid": os.getpid(), "start": started - launched, "import": imported - started}
    row.update(init=inited - imported, init_done=inited - launched, checks={}, tcp_src=tcp_src)
    row["init_cpu"] = time.process_time() - cpu  # every thread of the process, while init() ran
    row["rss_init_kib"] = status()["rss_kib"]
    for nbytes in sizes:
        count = max(1, nbytes // 4)
        # rank r, element i: ((31 r + i) mod 97) / 8 - 6, exact in float32 and so is every sum
        residue = (31 * comm.rank + np.arange(count)) % 97
        x = (residue / 8 - 6).astype(np.float32)
        t = time.time()
        comm.all_reduce(x, op=uniccl.SUM)
        took = time.time() - t
        ranks = np.arange(comm.size, dtype=np.float64)[:, None]
        per_residue = ((31 * ranks + np.arange(97)) % 97 / 8 - 6).sum(axis=0)  # float64, over the ranks
        want = per_residue[np.arange(count) % 97]
        err = float(np.max(np.abs(x.astype(np.float64) - want)))
        check = {"seconds": took, "done": t + took - launched, "max_err": err, "ok": err <= 1e-6 * comm.size}
        del residue, ranks, want
        row["checks"][str(nbytes)] = {**check, "rss_kib": status()["rss_kib"]}
    row.update(holdings())  # just after this rank's last call (a peer may still be in it)
    t = time.time()
    comm.barrier()
    row["barrier"] = time.time() - t
    row["after_barrier"] = holdings()  # every rank is past the calls
    try:
        row["transport"] = comm.stats().get("transport")
    except Exception as exc:  # only a label
        row["transport"] = f"? ({exc})"
    tmp = folder / f".{comm.rank}.json"
    tmp.write_text(json.dumps(row))
    tmp.rename(folder / f"{comm.rank}.json")
    t = time.time()
    comm.destroy()
    (folder / f"{comm.rank}.destroy").write_text(str(time.time() - t))
    return 0


# ----------------------------------------------------------------------------- the driver's side
def snapshot() -> dict[str, set[str]]:
    out = {}
    for d in ("/dev/shm", tempfile.gettempdir()):
        try:
            out[d] = set(os.listdir(d))
        except OSError:
            out[d] = set()
    return out


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def leftovers(before: dict[str, set[str]], pids: list[int], launcher: int, folder: Path) -> list[str]:
    """What the job left: live rank processes, new /dev/shm and /tmp entries naming a rank's or
    the launcher's pid or uniccl (other work on the machine makes entries too), and the files
    of the job's status directory ($TMPDIR/uniccl-<uid>/jobs/*-<launcher pid>, kept by design)."""
    time.sleep(0.5)
    found = [f"rank process {p} still alive" for p in pids if alive(p)]
    tags = {str(p) for p in [*pids, launcher]}
    for d, names in snapshot().items():
        for name in sorted(names - before[d]):
            if Path(d, name) != folder and ("uniccl" in name or any(t in name for t in tags)):
                found.append(os.path.join(d, name))
    jobs = Path(tempfile.gettempdir(), f"uniccl-{os.getuid()}", "jobs")
    for job in jobs.glob(f"*-{launcher}"):
        files = sorted(p.name for p in job.iterdir())
        stray = [f for f in files if not re.fullmatch(r"rank-\d+\.json", f)]
        if stray:
            found.append(f"{job}: {len(stray)} stray files {stray[:3]}{' ...' * (len(stray) > 3)}")
        found.append(f"{job} (status dir, kept by design): {len(files) - len(stray)} rank-N.json files")
    return found


def installed_tcp() -> Path | None:
    """uniccl/transport/tcp of the uniccl the ranks will import (found, not imported)."""
    spec = importlib.util.find_spec("uniccl")
    return Path(spec.origin).parent / "transport" / "tcp" if spec and spec.origin else None


def collect(folder: Path, n: int, code: int, launched: float, tcp: Path | None, at_launch) -> dict:
    """Once the ranks have ended: their rows and the job's facts (``at_launch``: the digest of
    the TCP sources when the job started, compared with theirs now)."""
    wall = time.time() - launched
    rows = [json.loads(p.read_text()) for p in sorted(folder.glob("[0-9]*.json"))]
    for row in rows:
        done = folder / f"{row['rank']}.destroy"
        row["destroy"] = float(done.read_text()) if done.exists() else None
    result = {"ranks": n, "exit": code, "job_wall": wall, "rows": sorted(rows, key=lambda r: r["rank"])}
    result["tcp_src"] = {"path": str(tcp), "at_launch": at_launch, "at_end": source_digest(tcp) if tcp else None}
    return result


def run_job(n: int, sizes: list[int], timeout: float) -> dict:
    folder = Path(tempfile.mkdtemp(prefix="uniccl-scale-"))
    tcp = installed_tcp()
    at_launch = source_digest(tcp) if tcp else None
    env = {k: v for k, v in os.environ.items() if not k.startswith("UNICCL_")}
    cmd = [sys.executable, "-m", "uniccl", "run", "--no-prefix", "-n", str(n), "--timeout", str(int(timeout))]
    cmd += ["-x", "UNICCL_TRANSPORT=tcp"]
    before = snapshot()
    launched = time.time()
    args = [sys.executable, __file__, "--worker", str(folder), "--launched", repr(launched)]
    args += ["--sizes", ",".join(map(str, sizes))]
    log = folder / "job.log"
    with open(log, "wb") as out:
        job = subprocess.Popen([*cmd, *args], env=env, stdout=out, stderr=subprocess.STDOUT)
        try:
            code = job.wait(timeout=timeout + 30)
        except subprocess.TimeoutExpired:
            job.kill()
            code = job.wait()
    result = collect(folder, n, code, launched, tcp, at_launch)
    rows = result["rows"]
    result["leftovers"] = leftovers(before, [r["pid"] for r in rows], job.pid, folder)
    lines = log.read_text(errors="replace").splitlines()
    result["launcher_lines"] = [line for line in lines if line.startswith("uniccl run")]
    result["log_tail"] = lines[-20:]
    result["command"] = " ".join([*cmd[1:], "python", "benchmarks/scale_sim.py", "--worker", "..."])
    if code or len(rows) < n:  # the whole output stays for a look
        result["log"] = str(log)
    else:
        for p in folder.iterdir():
            p.unlink()
        folder.rmdir()
    return result


def memory_available() -> int:
    """MemAvailable of the machine, KiB."""
    with open("/proc/meminfo") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("MemAvailable:"))


def _read_exact(fd: int, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = os.read(fd, n - len(out))
        if not chunk:
            raise EOFError("the driver closed the pipe")
        out += chunk
    return out


def _open_gate(inited_r: int, go_w: int, n: int) -> None:
    """Once all n ranks said init() returned, let them all go on (fork mode's gate)."""
    try:
        _read_exact(inited_r, n)
        os.write(go_w, b"g" * n)  # (n bytes of a pipe: n <= 64 KiB)
    except (EOFError, OSError):  # a rank died in init(): the job fails anyway
        pass
    finally:
        os.close(inited_r)
        os.close(go_w)


def run_forked(n: int, sizes: list[int], timeout: float) -> dict:
    """``--fork``: the ranks are forked from this process after it imported numpy and uniccl and
    discovered the plugins (as from a fork server), so that n processes cost one import and
    discovery, and their shared pages once.  Each
    is given the environment ``uniccl run``'s local launcher gives a rank (UNICCL_RANK,
    UNICCL_WORLD_SIZE, UNICCL_LOCAL_*, UNICCL_RENDEZVOUS, UNICCL_JOB_SECRET, a status
    directory) and ``UNICCL_TRANSPORT=tcp``, then runs :func:`worker`: ``uniccl.init()`` and the
    rest as in a process of its own.  This process hosts the rendezvous, as the launcher does."""
    import atexit
    import traceback

    import numpy  # noqa: F401  (imported here once: the ranks inherit it)

    import uniccl
    import uniccl.comm.communicator
    import uniccl.transport.factory  # noqa: F401
    from uniccl._plugins import manager
    from uniccl.bootstrap.rendezvous import UID_BYTES, UniqueId, get_unique_id

    mgr = manager()  # plugin discovery, as a fork server would have done it: once
    mgr.backend(mgr.choose(None)[0])

    folder = Path(tempfile.mkdtemp(prefix="uniccl-scale-"))
    (folder / "status").mkdir()
    from uniccl.observability.status import prepare

    prepare(str(folder / "status"), n)  # as uniccl run's launcher does
    tcp = installed_tcp()
    at_launch = source_digest(tcp) if tcp else None
    before = snapshot()
    mem_before = memory_available()
    r, w = os.pipe()
    inited_r, inited_w = os.pipe()  # ranks -> driver: init() returned
    go_r, go_w = os.pipe()  # driver -> ranks: every rank's did
    # as a fork server does: what is here now stays out of the children's garbage collections,
    # which would otherwise write every object's header and so copy every page of it per child
    gc.collect()
    gc.freeze()
    sys.stdout.flush()
    sys.stderr.flush()
    launched = time.time()
    pids = []
    for rank in range(n):
        pid = os.fork()
        if pid == 0:  # the rank
            code = 1
            try:
                os.close(w)
                os.close(inited_r)
                os.close(go_w)
                started = time.time()
                uid = UniqueId.from_bytes(_read_exact(r, UID_BYTES))  # once the rendezvous listens
                os.close(r)
                for k in [k for k in os.environ if k.startswith("UNICCL_")]:
                    del os.environ[k]
                os.environ.update(
                    UNICCL_RANK=str(rank),
                    UNICCL_WORLD_SIZE=str(n),
                    UNICCL_LOCAL_RANK=str(rank),
                    UNICCL_LOCAL_SIZE=str(n),
                    UNICCL_NODE_RANK="0",
                    UNICCL_NNODES="1",
                    UNICCL_RENDEZVOUS=f"{uid.host}:{uid.port}",
                    UNICCL_JOB_SECRET=uid.secret.hex(),
                    UNICCL_STATUS_DIR=str(folder / "status"),
                    UNICCL_TRANSPORT="tcp",
                )
                code = worker(folder, launched, sizes, started, gate=(inited_w, go_r))
            except BaseException:
                traceback.print_exc()
            finally:
                try:
                    atexit._run_exitfuncs()  # (uniccl's linger at exit: the peers' last checks)
                finally:
                    os._exit(code)
        pids.append(pid)
    os.close(r)
    forked = time.time() - launched
    uid = get_unique_id(timeout + 60, host="127.0.0.1")
    for _ in pids:  # 128 bytes, less than PIPE_BUF: each rank's read takes one whole copy
        os.write(w, bytes(uid))
    os.close(w)
    os.close(inited_w)
    os.close(go_r)
    threading.Thread(target=_open_gate, args=(inited_r, go_w, n), daemon=True).start()
    deadline, codes, low = time.monotonic() + timeout, {}, mem_before
    while len(codes) < n and time.monotonic() < deadline:
        low = min(low, memory_available())
        for pid in pids:
            if pid not in codes:
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    codes[pid] = os.waitstatus_to_exitcode(status)
        time.sleep(0.2)
    for pid in pids:
        if pid not in codes:
            os.kill(pid, 9)
            codes[pid] = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    code = next((c for c in codes.values() if c), 0)
    result = collect(folder, n, code, launched, tcp, at_launch)
    rows = result["rows"]
    result["forked_s"] = forked
    result["machine_mem_used_mib"] = (mem_before - low) / 1024
    result["leftovers"] = leftovers(before, pids, os.getpid(), folder)
    result["launcher_lines"] = [f"fork mode: {sum(1 for c in codes.values() if c)} ranks exited non-zero"]
    result["log_tail"] = []
    result["command"] = f"python benchmarks/scale_sim.py --fork --ranks {n}"
    if not code and len(rows) == n:
        shutil.rmtree(folder)
    else:
        result["log"] = str(folder)
    return result


def median_max(values: list[float]) -> tuple[float, float]:
    return (statistics.median(values), max(values)) if values else (float("nan"), float("nan"))


_METRICS = [  # label, row key, scale, format
    ("launch to the worker running, s", "start", 1, ".2f"),
    ("import numpy + uniccl, s", "import", 1, ".2f"),
    ("uniccl.init(), s", "init", 1, ".2f"),
    ("VmRSS after init(), MiB", "rss_init_kib", 1 / 1024, ".1f"),
    ("launch to init() returned, s", "init_done", 1, ".2f"),
    ("CPU time during init(), ms", "init_cpu", 1000, ".1f"),
    ("fds", "fds", 1, ".0f"),
    ("TCP sockets established", "established", 1, ".0f"),
    ("TCP sockets listening", "listening", 1, ".0f"),
    ("TCP sockets other states", "tcp_other", 1, ".0f"),
    ("other sockets (unix, ...)", "other", 1, ".0f"),
    ("threads (/proc Threads:)", "threads", 1, ".0f"),
    ("python threads", "py_threads", 1, ".0f"),
    ("reader threads uniccl-tcp-r*", "readers", 1, ".0f"),
    ("sender threads uniccl-tcp-s*", "senders", 1, ".0f"),
    ("VmRSS, MiB", "rss_kib", 1 / 1024, ".1f"),
    ("VmHWM, MiB", "hwm_kib", 1 / 1024, ".1f"),
    ("Pss (shared pages split), MiB", "pss_kib", 1 / 1024, ".1f"),
    ("comm.barrier() after them, s", "barrier", 1, ".2f"),
    ("comm.destroy(), s", "destroy", 1, ".2f"),
]


def report(res: dict, sizes: list[int]) -> None:
    rows, n = res["rows"], res["ranks"]
    print(f"\n== {n} ranks: exit {res['exit']}, {len(rows)}/{n} rows, whole job {res['job_wall']:.1f} s")
    src = res["tcp_src"]
    changed = "" if src["at_launch"] == src["at_end"] else f", CHANGED during the job to {src['at_end']}"
    print(f"   {src['path']}/*.py sha256 at launch {src['at_launch']}{changed}")
    if "forked_s" in res:
        print(
            f"   fork mode: {n} ranks forked in {res['forked_s']:.2f} s; the machine's memory in use rose by "
            f"{res['machine_mem_used_mib']:.0f} MiB at most (MemAvailable, sampled every 0.2 s)"
        )
    if not rows:
        print(f"   no rank got past its measurements; the job's whole output: {res.get('log')}; the launcher said:")
        print("\n".join("   | " + line for line in res["launcher_lines"]))
        print("   the job's last lines:")
        print("\n".join("   | " + line for line in res["log_tail"]))
        return
    transports = sorted({str(r.get("transport")) for r in rows})
    sources = sorted({str(r.get("tcp_src")) for r in rows})
    init_wall = max(r["init_done"] for r in rows)
    print(f"   transport {', '.join(transports)} (the ranks' tcp/*.py sha256 {', '.join(sources)})")
    print(f"   job init wall (launch to the last init() returned) {init_wall:.2f} s")
    prev = init_wall
    for nbytes in sizes:
        checks = [r["checks"].get(str(nbytes)) for r in rows]
        bad = sum(1 for c in checks if not c or not c["ok"])
        secs = median_max([c["seconds"] * 1e3 for c in checks if c])
        err = max((c["max_err"] for c in checks if c), default=float("nan"))
        rss = statistics.median(c["rss_kib"] / 1024 for c in checks if c)
        last = max(c["done"] for c in checks if c) - prev
        prev = max(c["done"] for c in checks if c)
        print(
            f"   all_reduce {nbytes} B float32: {'ok' if not bad else f'{bad} ranks WRONG'} (max |err| {err:g}), "
            f"call median {secs[0]:.0f} ms, max {secs[1]:.0f} ms (waits for the slowest rank included); "
            f"the last rank done {last * 1e3:.0f} ms after the last one's step before; VmRSS after {rss:.1f} MiB"
        )
    print(f"   {'per rank':34} {'median':>9} {'max':>9} {'min':>9}  rank of the max")
    for label, key, scale, fmt in _METRICS:
        have = [r for r in rows if r.get(key) is not None]
        if have:
            values = [r[key] * scale for r in have]
            med, top = median_max(values)
            at = max(have, key=lambda r: r[key])["rank"]
            print(f"   {label:34} {med:>9{fmt}} {top:>9{fmt}} {min(values):>9{fmt}}  {at}")
    print(f"   {'after comm.barrier():':34}")
    for label, key in (
        ("  TCP sockets established", "established"),
        ("  threads (/proc Threads:)", "threads"),
        ("  reader threads", "readers"),
        ("  sender threads", "senders"),
    ):
        values = [r["after_barrier"][key] for r in rows]
        print(f"   {label:34} {statistics.median(values):>9.0f} {max(values):>9.0f} {min(values):>9.0f}")
    most = max(rows, key=lambda r: r["fds"])
    print(f"   fds by kind, rank 0: {rows[0]['fd_kinds']}; rank {most['rank']}: {most['fd_kinds']}")
    print(f"   python threads by name, rank 0: {rows[0]['thread_kinds']}")
    most = max(rows, key=lambda r: r["py_threads"])
    print(f"   rank {most['rank']}: {most['thread_kinds']}")
    left = [item for item in res["leftovers"] if "kept by design" not in item]
    kept = [item for item in res["leftovers"] if "kept by design" in item]
    print("   left behind: " + ("nothing" if not left else "") + "".join(f"\n     {item}" for item in left))
    for item in kept:
        print(f"   {item}")
    if res["exit"] or len(rows) < n:
        print(f"   the job's whole output: {res.get('log')}; the launcher said:")
        print("\n".join("   | " + line for line in res["launcher_lines"]))
        print("   the job's last lines:")
        print("\n".join("   | " + line for line in res["log_tail"]))


def summary(results: list[dict]) -> None:
    head = f"{'n':>4} {'job s':>6} {'init wall':>9} {'init med/max':>13} {'est sockets':>11} {'after barrier':>13} "
    head += f"{'threads med/max':>15} {'readers':>7} {'RSS MiB med/max':>15}"
    print("\n" + head)
    for res in results:
        rows = res["rows"]
        if not rows:
            print(f"{res['ranks']:>4} {res['job_wall']:>6.1f}  failed (exit {res['exit']})")
            continue

        def mm(key, scale=1.0, fmt=".0f", rows=rows):
            med, top = median_max([r[key] * scale for r in rows])
            return f"{med:{fmt}}/{top:{fmt}}"

        after = mm("established", rows=[r["after_barrier"] for r in rows])
        print(
            f"{res['ranks']:>4} {res['job_wall']:>6.1f} {max(r['init_done'] for r in rows):>9.2f} "
            f"{mm('init', fmt='.2f'):>13} {mm('established'):>11} {after:>13} {mm('threads'):>15} {mm('readers'):>7} "
            f"{mm('rss_kib', 1 / 1024, '.1f'):>15}"
        )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", default="16,32,64", help="rank counts, one job each (default 16,32,64)")
    ap.add_argument("--sizes", default="8,1M", help="all_reduce sizes in bytes, K/M suffixes (default 8,1M)")
    ap.add_argument("--timeout", type=float, default=180, help="seconds per job (uniccl run --timeout)")
    ap.add_argument("--json", help="write every rank's row and the summaries here ('-': stdout)")
    ap.add_argument(
        "--fork",
        action="store_true",
        help="fork the ranks from this process after one import of numpy and uniccl, instead of "
        "'uniccl run' starting each as a new Python (fits ~4x more ranks in memory)",
    )
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--launched", type=float, help=argparse.SUPPRESS)
    args = ap.parse_args()
    sizes = [parse_size(s) for s in args.sizes.split(",") if s.strip()]
    if args.worker:
        return worker(Path(args.worker), args.launched, sizes)
    results = []
    for n in (int(s) for s in args.ranks.split(",")):
        print(f"-- {n} ranks ...", flush=True)
        res = (run_forked if args.fork else run_job)(n, sizes, args.timeout)
        results.append(res)
        report(res, sizes)
        sys.stdout.flush()
    summary(results)
    if args.json:
        text = json.dumps({"sizes": sizes, "load": os.getloadavg(), "jobs": results}, indent=1)
        if args.json == "-":
            print(text)
        else:
            Path(args.json).write_text(text)
    return 0 if all(r["exit"] == 0 and len(r["rows"]) == r["ranks"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
