#!/usr/bin/env bash
# Quick start 1: install uniccl (core + cpu plugin, MPICH) into .venv and run a 4-rank
# all_reduce benchmark on the CPU plugin, printed as an nccl-tests style table.
source "$(dirname "$0")/_setup.sh"
build_wheels
make_venv .venv mpich
exec .venv/bin/uniccl bench all_reduce -np "${NP:-4}" -b 8 -e 64M -f 4 -c 1 "$@"
