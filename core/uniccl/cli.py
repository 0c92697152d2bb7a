"""The ``uniccl`` command: ``info``, ``bench``, ``run``, ``examples``, ``doctor``, ``report``, ``top``, ``trace``."""
from __future__ import annotations

import argparse
import json
import sys


def _info(args) -> int:
    from ._info import all_ranks, format_info, info

    if args.all_ranks:
        return all_ranks(args.json)
    data = info()
    print(json.dumps(data, indent=2, default=str) if args.json else format_info(data))
    return 0


def main(argv=None) -> int:
    from . import _bench
    from . import _doctor, _examples, _report, _run, _top, _trace

    parser = argparse.ArgumentParser(prog="uniccl", description="uniccl command-line tools")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("info", help="plugins, their state and why; the chosen platform; MPI")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--all-ranks", action="store_true", help="under a launcher (uniccl run -n 4 uniccl info "
                   "--all-ranks): one row per rank with host, platform and device, printed by rank 0")
    p.set_defaults(func=_info)
    p = sub.add_parser("bench", help="nccl-tests style collective benchmark")
    _bench.add_arguments(p)
    p.set_defaults(func=_bench.main)
    p = sub.add_parser("run", help="launch a job: local, mpi, ssh or slurm launcher")
    _run.add_arguments(p)
    p.set_defaults(func=_run.main)
    p = sub.add_parser("examples", help="run examples/*.py under the launcher; one log each, a summary table")
    _examples.add_arguments(p)
    p.set_defaults(func=_examples.main)
    p = sub.add_parser("doctor", help="line up the ranks' flight-recorder dumps; print the first divergence")
    _doctor.add_arguments(p)
    p.set_defaults(func=_doctor.main)
    p = sub.add_parser("report", help="one HTML page with plots and findings from a job's traces and stats")
    _report.add_arguments(p)
    p.set_defaults(func=_report.main)
    p = sub.add_parser("top", help="live view of a running job: per rank its call, bandwidth, what it waits on")
    _top.add_arguments(p)
    p.set_defaults(func=_top.main)
    p = sub.add_parser("trace", help="traces written under UNICCL_TRACE=DIR: merge the ranks onto one timeline")
    _trace.add_arguments(p)
    p.set_defaults(func=_trace.main)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
