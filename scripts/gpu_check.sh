#!/usr/bin/env bash
# The NVIDIA check, for a machine with one NVIDIA GPU, CUDA, NCCL (the nvidia-nccl wheel or
# $NCCL_HOME) and the build tools (cython, scikit-build-core, numpy, pluggy): builds uniccl, the
# cpu and nvidia plugins (kernels with nvcc), runs the conformance suite on the real device
# (native NCCL at 1 rank, host staging at 1-2 ranks), then the per-call comparison with NCCL
# called directly; the table comes last.  Under 8 minutes on an H200 machine.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1 NCCL_DEBUG="${NCCL_DEBUG:-WARN}"
PY="${PYTHON:-python3}"
if [ -z "${NCCL_HOME:-}" ]; then
    lib=$(find /opt /usr/local /usr/lib -name 'libnccl.so.2' 2>/dev/null | head -1)
    [ -n "$lib" ] && export NCCL_HOME="$(dirname "$(dirname "$lib")")"
fi
echo "== build (NCCL_HOME=${NCCL_HOME:-unset})"
"$PY" -m pip install -q --no-build-isolation --no-deps . ./plugins/cpu ./plugins/nvidia || exit 1
echo "== uniccl info"
"$PY" -m uniccl info
status=0
echo "== conformance on the GPU"
UNICCL_TEST_RANKS=1,2 timeout 300 "$PY" -m pytest -q -p no:cacheprovider tests/conformance \
    --uniccl-platform=nvidia --uniccl-real || status=1
if [ "${UNICCL_GPU_KERNELS:-1}" = 1 ]; then
    echo "== kernels on the GPU"
    timeout 200 "$PY" -m pytest -q -p no:cacheprovider tests/test_cuda_kernels.py || status=1
fi
echo "== uniccl vs NCCL direct, one GPU"
UNICCL_PLUGINS=^nccl timeout 60 "$PY" -m uniccl run -n 1 benchmarks/gpu_native.py || status=1
timeout 120 "$PY" -m uniccl run -n 1 benchmarks/gpu_native.py || status=1
exit $status
