"""The ``uniccl`` command: ``info``, ``bench``, ``run``, ``examples``, ``doctor``, ``report``, ``top``, ``trace``."""

from __future__ import annotations

import argparse
import json
import os
import sys


def _info(args) -> int:
    from .tools.info import all_ranks, format_info, info

    if args.all_ranks:
        return all_ranks(args.json)
    data = info()
    print(json.dumps(data, indent=2, default=str) if args.json else format_info(data))
    return 0


def main(argv=None) -> int:
    from ._version import __version__
    from .launch import run as _run
    from .observability import trace as _trace
    from .tools import bench as _bench
    from .tools import doctor as _doctor
    from .tools import examples as _examples
    from .tools import report as _report
    from .tools import top as _top

    parser = argparse.ArgumentParser(prog="uniccl", description="uniccl command-line tools")
    parser.add_argument("--version", action="version", version=f"uniccl {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("info", help="plugins, their state and why; the chosen platform; MPI")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument(
        "--all-ranks",
        action="store_true",
        help="under a launcher (uniccl run -n 4 uniccl info "
        "--all-ranks): one row per rank with host, platform and device, printed by rank 0",
    )
    p.set_defaults(func=_info)
    for name, module, what in (
        ("bench", _bench, "nccl-tests style collective benchmark"),
        ("run", _run, "launch a job: local, mpi, ssh or slurm launcher"),
        ("examples", _examples, "run examples/*.py under the launcher; one log each, a summary table"),
        ("doctor", _doctor, "what is wrong with a job: verdicts from its dumps and traces, or live (--live)"),
        ("report", _report, "one HTML page with plots and findings from a job's traces and stats"),
        ("top", _top, "live view of a running job: per rank its call, bandwidth, what it waits on"),
        ("trace", _trace, "traces written under UNICCL_TRACE=DIR: merge the ranks onto one timeline"),
    ):
        p = sub.add_parser(name, help=what)
        module.add_arguments(p)
        p.set_defaults(func=module.main)
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except BrokenPipeError:  # `uniccl doctor DIR | head`: the reader left; no traceback for that
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
