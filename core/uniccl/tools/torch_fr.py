"""``uniccl doctor --torch-fr OUT DIR``: the flight-recorder dumps in DIR written again in the format
of torch's own flight recorder (a pickle per rank, format version ``VERSION``), so that torch's
``torchfrtrace OUT`` reads a uniccl job as it reads a ProcessGroupNCCL one.

The job's communicator of all its ranks is torch's default process group; each recorded call is
an entry: its sequence number (collectives, and point-to-point calls apart, as torch counts them),
``<backend>:<op>`` (send and recv as torch writes them, ``send 0->1``), input and output sizes and
dtypes as the matching in torch's analyzer expects them for each collective, its state, times and
the caller's source line as the entry's one frame.  torch's analyzer accepts only the backend
names it knows, so the prefix is ``xccl`` (it checks the name, nothing more).  What torch's format
cannot hold is left out: the path a call took, uniccl's error messages.
"""

from __future__ import annotations

import os
import pickle
import re

from .._errors import InvalidArgument

VERSION = "2.10"  # the format torch 2.13's analyzer reads (collectives outside coalesced groups: >= 2.7)
BACKEND = "xccl"
_TORCH_DTYPE = {
    "float16": "Half",
    "bfloat16": "BFloat16",
    "float32": "Float",
    "float64": "Double",
    "int8": "Char",
    "uint8": "Byte",
    "int16": "Short",
    "uint16": "UInt16",
    "int32": "Int",
    "uint32": "UInt32",
    "int64": "Long",
    "uint64": "UInt64",
}
_STATE = {"enqueued": "scheduled", "started": "started", "completed": "completed", "failed": "started"}


def _sizes(op: str, count: int, size: int) -> tuple[list, list]:
    """(input sizes, output sizes) of one call as torch records them (one tensor each; uniccl's
    count is what its record holds: the whole buffer, or one rank's block)."""
    whole = {
        "all_gather": ([count], [count * size]),
        "gather": ([count], [count * size]),
        "reduce_scatter": ([count * size], [count]),
        "scatter": ([count * size], [count]),
        "all_to_all": ([count * size], [count * size]),
        "barrier": ([0], [0]),
    }
    i, o = whole.get(op, ([count], [count]))
    return [i], [o]


def _frames(site: str | None) -> list:
    """``file:line (function)`` as torch's frame list."""
    m = re.match(r"(.*):(\d+) \((.*)\)$", site or "")
    return [{"name": m.group(3), "filename": m.group(1), "line": int(m.group(2))}] if m else []


def entries(dump: dict, pg: str) -> list[dict]:
    """torch's entries for one rank's dump of one communicator (process group ``pg``)."""
    out, p2p = [], 0
    for i, op in enumerate(dump["ops"]):
        name = op["op"]
        is_p2p = name in ("send", "recv")
        if is_p2p:
            p2p += 1
            peer, me = op.get("peer"), dump["rank"]
            name = f"send {me}->{peer}" if name == "send" else f"recv {me}<-{peer}"
        elif op.get("seq") is None:
            continue  # a collective that never got its number (failed its own checks)
        count = op.get("count") or 0
        dtype = _TORCH_DTYPE.get(op.get("dtype") or "", "Byte")
        ins, outs = _sizes(op["op"], count, dump["size"])
        t0 = int((op.get("t_enqueued") or 0) * 1e9)
        t1 = int((op.get("t_started") or 0) * 1e9) or None
        t2 = int((op.get("t_completed") or 0) * 1e9) if op["state"] == "completed" else None
        out.append(
            {
                "record_id": i,
                "pg_id": 0,
                "process_group": (pg, dump["communicator"]),
                "collective_seq_id": 0 if is_p2p else op["seq"] + 1,  # (torch's count from 1)
                "p2p_seq_id": p2p if is_p2p else 0,
                "op_id": i,
                "profiling_name": f"{BACKEND}:{name}",
                "time_created_ns": t0,
                "time_discovered_started_ns": t1,
                "time_discovered_completed_ns": t2,
                "duration_ms": (t2 - t1) / 1e6 if t1 and t2 else None,
                "input_sizes": ins,
                "input_dtypes": [dtype],
                "output_sizes": outs,
                "output_dtypes": [dtype],
                "state": _STATE.get(op["state"], "scheduled"),
                "retired": op["state"] in ("completed", "failed"),
                "timeout_ms": None,
                "is_p2p": is_p2p,
                "frames": _frames(op.get("site")),
            }
        )
    return out


def write(groups: dict, out: str) -> list[str]:
    """Write the job's communicator of all its ranks (``world``, else the largest) from ``groups``
    ({communicator: {rank: dump}}, :func:`uniccl.tools.verdicts.load_dumps`) as torch flight-recorder
    dumps ``OUT/uniccl_fr_trace_<rank>`` (process group "0"); their paths.  Another communicator's
    ranks are not the job's, so its calls are left out."""
    if not groups:
        raise InvalidArgument("no uniccl-flight-*.json dumps to write", op="doctor", argument="directory")
    name = max(groups, key=lambda n: (n == "world", max(d["size"] for d in groups[n].values())))
    dumps = groups[name]
    size = max(d["size"] for d in dumps.values())
    config = {"0": {"name": "0", "desc": name, "ranks": str(list(range(size)))}}
    os.makedirs(out, exist_ok=True)
    paths = []
    for r, dump in sorted(dumps.items()):
        path = os.path.join(out, f"uniccl_fr_trace_{r}")
        with open(path, "wb") as f:
            pickle.dump({"version": VERSION, "pg_config": config, "pg_status": {}, "entries": entries(dump, "0")}, f)
        paths.append(path)
    return paths
