"""``uniccl.info()`` / ``uniccl info``: what is installed, what works, and why."""

from __future__ import annotations

import json
import platform as _platform
import sys

from .._errors import UnicclError
from .._plugins import manager
from .._version import __version__
from ..transport import TRANSPORTS


def info() -> dict:
    """Plugins (version, plugin API, state, reason, devices, transports), the platform that
    would be chosen and why, the MPI library, and the Python stack versions."""
    import numpy

    mgr = manager()
    plugins = []
    for rec in mgr.discover():
        entry = {
            "name": rec.name,
            "distribution": rec.distribution,
            "version": rec.version,
            "priority": rec.priority,
            "state": rec.state,
            "reason": rec.reason,
            "devices": rec.probe.get("devices", []),
            "versions": rec.probe.get("versions", {}),
            "kernels": rec.probe.get("kernels", ""),
            "api_version": rec.api or rec.info.get("api_version"),
            "adapted": rec.adapted,
            "transports": list(TRANSPORTS),
        }
        plugins.append(entry)
    try:
        chosen, why = mgr.choose()
        choice = {"platform": chosen.name, "why": why}
    except UnicclError as exc:
        choice = {"platform": None, "why": str(exc)}
    try:
        import mpi4py

        from ..transport.mpi import library, ulfm

        mpi_info = dict(library(), mpi4py=mpi4py.__version__)
        mpi_info["ulfm"], mpi_info["ulfm_why"] = ulfm()
    except Exception as exc:  # info must work even when MPI is broken
        mpi_info = {"name": None, "error": str(exc)}
    return {
        "uniccl": __version__,
        "plugins": plugins,
        "chosen": choice,
        "mpi": mpi_info,
        "python": sys.version.split()[0],
        "numpy": numpy.__version__,
        "host": _platform.node(),
        "machine": _platform.machine(),
    }


def format_info(data: dict) -> str:
    lines = [
        f"uniccl {data['uniccl']}  (python {data['python']}, numpy {data['numpy']}, "
        f"host {data['host']} {data['machine']})"
    ]
    m = data["mpi"]
    if m.get("name"):
        lines.append(
            f"MPI: {m['name']} {m['version']} (MPI {m['standard']}, thread level "
            f"{m['thread_level']}, mpi4py {m['mpi4py']})"
        )
        lines.append(f"MPI fault tolerance: {m['ulfm_why']}")
    else:
        lines.append(f"MPI: unavailable: {m.get('error')}")
    lines.append("plugins:")
    if not data["plugins"]:
        lines.append("  (none installed: pip install uniccl-cpu)")
    for p in data["plugins"]:
        state = p["state"] + (f": {p['reason']}" if p["reason"] else "")
        lines.append(f"  {p['name']:<10} {p['version']:<8} priority {p['priority']:<3} {state}")
        for d in p["devices"]:
            mem = d.get("total_memory") or 0
            lines.append(f"      device {d.get('index')}: {d.get('name')} ({mem / 2**30:.1f} GiB)")
        if p["kernels"]:
            lines.append(f"      kernels: {p['kernels']}")
        if p["versions"]:
            lines.append("      versions: " + ", ".join(f"{k} {v}" for k, v in p["versions"].items()))
        if p["state"] == "available":
            api = f"plugin API {p['api_version']}" + (f" through its adapter ({p['adapted']})" if p["adapted"] else "")
            lines.append(f"      {api}; transports: {', '.join(p['transports'])}")
    c = data["chosen"]
    lines.append(f"chosen platform: {c['platform'] or 'none'} ({c['why']})")
    return "\n".join(lines)


def all_ranks(as_json: bool = False) -> int:
    """Every rank of the job reports host, platform, device and transport; rank 0 prints them."""
    import socket

    from ..comm.world import init

    with init() as comm:
        probe = comm.platform_probe
        devices = probe.get("devices") or [{}]
        dev = devices[comm.device] if comm.device < len(devices) else {}
        row = {
            "rank": comm.rank,
            "host": socket.gethostname(),
            "platform": comm.platform,
            "device": comm.device,
            "device_name": dev.get("name", ""),
            "local_rank": comm.local_rank,
            "transport": comm.tuner.transport,
            "native": comm.native_library or "",
            "kernels": str(probe.get("kernels", "")),
        }
        rows = comm.all_gather_object(row)
    if rows[0]["rank"] == comm.rank == 0 or comm.size == 1:
        if as_json:
            print(json.dumps(rows, indent=2))
        else:
            print(f"{'rank':>4}  {'host':<16} {'platform':<10} {'dev':>3}  {'device':<28} {'transport':<9} native")
            for r in rows:
                print(
                    f"{r['rank']:>4}  {r['host']:<16} {r['platform']:<10} {r['device']:>3}  "
                    f"{r['device_name'][:28]:<28} {r['transport']:<9} {r['native'] or '-'}"
                )
    return 0
