#!/usr/bin/env bash
# Compiles the shared CUDA kernels (plugins/shared/cuda_kernels) with nvcc for sm_80, sm_90 and
# compute_90 PTX into build/cuda-kernels/, through the CMake function the plugins use, and lists
# the machine code and PTX in the library.  nvcc comes from cuda_toolchain (PyPI wheels in
# .venv-cuda).  Exits non-zero when nvcc cannot be had or the kernels do not compile.
source "$(dirname "$0")/_setup.sh"
SECONDS=0
if ! nvcc=$(cuda_toolchain); then
    echo "check_cuda_kernels: no nvcc" >&2
    exit 1
fi
echo "nvcc: $nvcc ($("$nvcc" --version | grep -o 'release [0-9.]*'), ready in ${SECONDS}s)"
out=build/cuda-kernels
mkdir -p build
rm -rf "$out"
SECONDS=0
cmake -S plugins/shared/cuda_kernels -B "$out" -DUNICCL_KERNELS_DIALECTS=cuda \
    -DUNICCL_CUDA_COMPILER="$nvcc" >"$out.log" 2>&1 || { cat "$out.log"; exit 1; }
IFS=$'\t' read -r _ info lib _ <"$out/kernels-info.txt"
echo "kernels: $info"
[ -n "$lib" ] || exit 1
cmake --build "$out" >>"$out.log" 2>&1 || { cat "$out.log"; exit 1; }
echo "built $lib in ${SECONDS}s"
cuobjdump="$(dirname "$nvcc")/cuobjdump"
[ -x "$cuobjdump" ] || cuobjdump=$(command -v cuobjdump) || true
if [ -n "$cuobjdump" ]; then
    "$cuobjdump" --list-elf --list-ptx "$lib"
else
    echo "no cuobjdump to list the library's contents"
fi
