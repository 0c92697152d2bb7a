"""Another local user hammering a rendezvous port (run by the tests as uid nobody where they
can): random bytes, truncated frames, huge lengths, JSON of the wrong shape, wrong proofs
(claiming real ranks), slow clients trickling a byte every 3 s, and a flood of idle
connections -- all at once, until STOP_FILE exists or SECONDS pass.  Standard library only.
usage: rdv_attacker.py HOST PORT SECONDS STOP_FILE
Prints one line: how many connections each attack made."""

import json
import os
import random
import socket
import struct
import sys
import threading
import time

host, port, seconds, stop_file = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
end = time.monotonic() + seconds
counts: dict = {}
held = []  # sockets kept open on purpose


def running() -> bool:
    return time.monotonic() < end and not os.path.exists(stop_file)


def connect():
    s = socket.create_connection((host, port), timeout=5)
    held.append(s)
    return s


def frame(obj) -> bytes:
    data = obj if isinstance(obj, bytes) else json.dumps(obj).encode()
    return struct.pack("!I", len(data)) + data


def read_nonce(s):
    try:
        s.settimeout(2)
        s.recv(4096)
    except OSError:
        pass


def attack(name, body, pause=0.01):
    def loop():
        rng = random.Random(name)
        while running():
            try:
                s = connect()
                body(s, rng)
                counts[name] = counts.get(name, 0) + 1
            except OSError:
                counts[name + "_refused"] = counts.get(name + "_refused", 0) + 1
            time.sleep(pause)

    t = threading.Thread(target=loop, daemon=True)
    t.start()
    return t


def json_list(s, rng):
    read_nonce(s)
    s.sendall(b"\0\0\0\x02[]")  # once killed the rendezvous thread (AttributeError)
    s.close()


def random_bytes(s, rng):
    s.sendall(os.urandom(rng.randrange(1, 4096)))
    s.close()


def truncated(s, rng):
    read_nonce(s)
    s.sendall(struct.pack("!I", 100) + b'{"proof": "')
    s.close()


def huge(s, rng):
    read_nonce(s)
    s.sendall(b"\xff\xff\xff\xff" + os.urandom(64))


def wrong_shape(s, rng):
    read_nonce(s)
    s.sendall(
        frame(
            rng.choice(
                [
                    {"proof": 5},
                    {"proof": "x", "rank": "0", "size": 2},
                    {"rank": 0},
                    [1, 2],
                    "s",
                    None,
                    7,
                    {"proof": None, "rank": None, "size": None, "payload": None},
                ]
            )
        )
    )
    s.close()


def wrong_proof(s, rng):
    read_nonce(s)
    for rank in (0, 1):  # claims a real rank's place, with a made-up proof
        s.sendall(frame({"proof": "%064x" % rng.getrandbits(256), "rank": rank, "size": 2, "payload": {"x": 1}}))
    s.close()


def slow(s, rng):
    while running():  # one byte every 3 s, forever
        s.sendall(b"\0")
        time.sleep(3)


threads = [
    attack("json_list", json_list),
    attack("random_bytes", random_bytes),
    attack("truncated", truncated),
    attack("huge_length", huge),
    attack("wrong_shape", wrong_shape),
    attack("wrong_proof", wrong_proof),
]
threads += [attack(f"slow{i}", slow, pause=0.5) for i in range(4)]
flood = 0
while running() and flood < 600:  # idle connections that never say anything
    try:
        connect()
        flood += 1
    except OSError:
        time.sleep(0.05)
counts["idle_flood"] = flood
while running():
    time.sleep(0.1)
print(json.dumps(counts), flush=True)
