# uniccl_cuda_kernels(<target> <dialect> <out_var>)
#
# Builds the shared reduction kernels (reduce.cu) into a shared library with the
# compiler of <dialect>, when that compiler is present and works:
#   cuda    nvcc: sm_80 and sm_90 machine code plus compute_90 PTX (UNICCL_CUDA_ARCHS)
#   ivcore  Iluvatar CoreX clang++ -x ivcore --cuda-gpu-arch=ivcore11 (UNICCL_IVCORE_ARCHS)
#   maca    MetaX mxcc -x maca
#   musa    Moore Threads mcc -x musa
#   host    the C++ compiler with host_compat.h: kernels run on the CPU (tests, CI)
# It never fails the including build: without a working compiler <target> is an
# empty target and no library is made.  Sets, in the caller's scope:
#   <out_var>          one line for `uniccl info`, e.g. "nvcc 13.0: sm_80, sm_90,
#                      compute_90 PTX", or "none: nvcc not found (searched: ...)"
#   <out_var>_LIBRARY  the library's path once built, or "" when there is none
#   <out_var>_COMPILER the compiler found, or "" when none was
# and <target>'s property UNICCL_KERNELS_LIBRARY to the same path.  The library
# exports the C ABI of uniccl_kernels.h; a plugin installs it and loads it.
#
# Per dialect, UNICCL_<DIALECT>_COMPILER (cache or environment) names the compiler
# outright and UNICCL_<DIALECT>_FLAGS adds flags.
include_guard(GLOBAL)

set(_UC_KERNELS_DIR "${CMAKE_CURRENT_LIST_DIR}")
set(UNICCL_CUDA_ARCHS "80;90" CACHE STRING
    "CUDA architectures for the uniccl kernels: machine code for each, PTX for the last")
set(UNICCL_IVCORE_ARCHS "ivcore11" CACHE STRING "CoreX GPU architectures for the uniccl kernels")

# Where the PyPI wheels put nvcc: nvidia/cu13/bin (nvidia-cuda-nvcc 13.x) and
# nvidia/cuda_nvcc/bin (nvidia-cuda-nvcc-cu12, which so far ships ptxas only).
function(_uc_python_site_dirs out)
  set(dirs "")
  set(pythons "${Python_EXECUTABLE}" "${Python3_EXECUTABLE}")
  if(NOT Python_EXECUTABLE AND NOT Python3_EXECUTABLE)
    find_program(_uc_python NAMES python3 python NO_CACHE)  # a project without find_package(Python)
    set(pythons "${_uc_python}")
  endif()
  foreach(py IN LISTS pythons)
    if(py)
      execute_process(COMMAND "${py}" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])"
                      OUTPUT_VARIABLE site OUTPUT_STRIP_TRAILING_WHITESPACE
                      RESULT_VARIABLE rc ERROR_QUIET)
      if(rc EQUAL 0 AND site)
        list(APPEND dirs "${site}")
      endif()
    endif()
  endforeach()
  list(REMOVE_DUPLICATES dirs)
  set(${out} "${dirs}" PARENT_SCOPE)
endfunction()

# First existing candidate in <candidates> (paths, or bare names looked up on PATH).
function(_uc_first_program out searched_out)
  set(searched "")
  foreach(c IN LISTS ARGN)
    if(NOT c)
      continue()
    endif()
    if(IS_ABSOLUTE "${c}")
      list(APPEND searched "${c}")
      if(EXISTS "${c}" AND NOT IS_DIRECTORY "${c}")
        set(${out} "${c}" PARENT_SCOPE)
        return()
      endif()
    else()
      list(APPEND searched "PATH")
      find_program(_uc_found NAMES "${c}" NO_CACHE)
      if(_uc_found)
        set(${out} "${_uc_found}" PARENT_SCOPE)
        return()
      endif()
    endif()
  endforeach()
  list(REMOVE_DUPLICATES searched)
  list(JOIN searched ", " searched)
  set(${out} "" PARENT_SCOPE)
  set(${searched_out} "${searched}" PARENT_SCOPE)
endfunction()

function(uniccl_cuda_kernels target dialect out_var)
  string(TOUPPER "${dialect}" DIALECT)
  set(src "${_UC_KERNELS_DIR}/reduce.cu")
  set(headers "${_UC_KERNELS_DIR}/uc_dialect.h" "${_UC_KERNELS_DIR}/uniccl_kernels.h"
              "${_UC_KERNELS_DIR}/host_compat.h")
  set(lib "${CMAKE_CURRENT_BINARY_DIR}/${CMAKE_SHARED_LIBRARY_PREFIX}uniccl_kernels_${dialect}")
  string(APPEND lib "${CMAKE_SHARED_LIBRARY_SUFFIX}")
  set(override "${UNICCL_${DIALECT}_COMPILER}")
  if(NOT override)
    set(override "$ENV{UNICCL_${DIALECT}_COMPILER}")
  endif()
  separate_arguments(extra UNIX_COMMAND "${UNICCL_${DIALECT}_FLAGS}")
  set(probe_flags "")

  if(dialect STREQUAL "cuda")
    set(name nvcc)
    _uc_python_site_dirs(sites)
    set(candidates "${override}" "${CMAKE_CUDA_COMPILER}")
    foreach(home IN ITEMS "$ENV{CUDA_HOME}" "$ENV{CUDA_PATH}")
      if(home)
        list(APPEND candidates "${home}/bin/nvcc")
      endif()
    endforeach()
    list(APPEND candidates nvcc)
    foreach(site IN LISTS sites)
      list(APPEND candidates "${site}/nvidia/cu13/bin/nvcc" "${site}/nvidia/cuda_nvcc/bin/nvcc")
    endforeach()
    # scripts/_setup.sh's cuda_toolchain puts the wheels' nvcc here
    get_filename_component(repo "${_UC_KERNELS_DIR}/../../.." ABSOLUTE)
    list(APPEND candidates "${repo}/.venv-cuda/bin/nvcc" "/usr/local/cuda/bin/nvcc")
    _uc_first_program(compiler searched ${candidates})
    set(arch_flags "")
    set(arch_desc "")
    list(GET UNICCL_CUDA_ARCHS -1 ptx_arch)
    foreach(a IN LISTS UNICCL_CUDA_ARCHS)
      list(APPEND arch_flags -gencode "arch=compute_${a},code=sm_${a}")
      list(APPEND arch_desc "sm_${a}")
    endforeach()
    list(APPEND arch_flags -gencode "arch=compute_${ptx_arch},code=compute_${ptx_arch}")
    list(APPEND arch_desc "compute_${ptx_arch} PTX")
    list(GET arch_flags 0 1 probe_arch)
    set(host_flags -fPIC -fvisibility=hidden -Wall -Wextra)
    list(JOIN host_flags "," host_flags)
    set(flags -std=c++17 -O3 -Xcompiler=${host_flags} ${arch_flags})
    set(probe_flags -std=c++17 ${probe_arch})
    if(CMAKE_CXX_COMPILER)
      list(APPEND flags -ccbin "${CMAKE_CXX_COMPILER}")
      list(APPEND probe_flags -ccbin "${CMAKE_CXX_COMPILER}")
    endif()
  elseif(dialect STREQUAL "ivcore")
    set(name "CoreX clang++")
    set(candidates "${override}")
    foreach(home IN ITEMS "$ENV{COREX_HOME}" "$ENV{COREX_PATH}" "/usr/local/corex")
      if(home)
        list(APPEND candidates "${home}/bin/clang++")
      endif()
    endforeach()
    _uc_first_program(compiler searched ${candidates})  # a plain clang++ on PATH is no CoreX
    set(arch_flags "")
    foreach(a IN LISTS UNICCL_IVCORE_ARCHS)
      list(APPEND arch_flags "--cuda-gpu-arch=${a}")
    endforeach()
    list(JOIN UNICCL_IVCORE_ARCHS ", " arch_desc)
    set(flags -x ivcore -std=c++17 -O3 -fPIC -fvisibility=hidden -Wall -Wextra -DUC_DIALECT_IVCORE
              ${arch_flags})
    set(probe_flags -x ivcore -std=c++17 -DUC_DIALECT_IVCORE ${arch_flags})
  elseif(dialect STREQUAL "maca")
    set(name mxcc)
    set(candidates "${override}")
    foreach(home IN ITEMS "$ENV{MACA_PATH}" "/opt/maca")
      if(home)
        list(APPEND candidates "${home}/mxgpu_llvm/bin/mxcc" "${home}/bin/mxcc")
      endif()
    endforeach()
    list(APPEND candidates mxcc)
    _uc_first_program(compiler searched ${candidates})
    set(arch_desc "default MACA targets")
    set(flags -x maca -std=c++17 -O3 -fPIC -fvisibility=hidden -Wall -Wextra -DUC_DIALECT_MACA)
    set(probe_flags -x maca -std=c++17 -DUC_DIALECT_MACA)
  elseif(dialect STREQUAL "musa")
    set(name mcc)
    set(candidates "${override}")
    foreach(home IN ITEMS "$ENV{MUSA_HOME}" "$ENV{MUSA_PATH}" "/usr/local/musa")
      if(home)
        list(APPEND candidates "${home}/bin/mcc")
      endif()
    endforeach()
    list(APPEND candidates mcc)
    _uc_first_program(compiler searched ${candidates})
    set(arch_desc "default MUSA targets")
    set(flags -x musa -std=c++17 -O3 -fPIC -fvisibility=hidden -Wall -Wextra -DUC_DIALECT_MUSA)
    set(probe_flags -x musa -std=c++17 -DUC_DIALECT_MUSA)
  elseif(dialect STREQUAL "host")
    set(name "C++ compiler")
    _uc_first_program(compiler searched "${override}" "${CMAKE_CXX_COMPILER}" c++ g++ clang++)
    set(arch_desc "kernels run on the CPU (host_compat.h)")
    set(flags -x c++ -std=c++17 -O2 -fPIC -fvisibility=hidden -Wall -Wextra
              -include "${_UC_KERNELS_DIR}/host_compat.h")
    set(probe_flags ${flags})
  else()
    message(FATAL_ERROR "uniccl_cuda_kernels: unknown dialect '${dialect}' "
                        "(cuda, ivcore, maca, musa or host)")
  endif()

  add_custom_target(${target})
  set_target_properties(${target} PROPERTIES UNICCL_KERNELS_LIBRARY "")
  set(${out_var}_LIBRARY "" PARENT_SCOPE)
  set(${out_var}_COMPILER "${compiler}" PARENT_SCOPE)
  if(NOT compiler)
    set(${out_var} "none: ${name} not found (searched: ${searched})" PARENT_SCOPE)
    return()
  endif()

  execute_process(COMMAND "${compiler}" --version OUTPUT_VARIABLE version_text
                  ERROR_VARIABLE version_text RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    set(${out_var} "none: ${compiler} does not run" PARENT_SCOPE)
    return()
  endif()
  set(version "")
  if(version_text MATCHES "release ([0-9]+\\.[0-9]+)")  # nvcc
    set(version " ${CMAKE_MATCH_1}")
  elseif(version_text MATCHES "version ([0-9]+(\\.[0-9]+)*)")  # clang-based compilers
    set(version " ${CMAKE_MATCH_1}")
  elseif(version_text MATCHES "\\) ([0-9]+\\.[0-9]+(\\.[0-9]+)?)")  # gcc: "g++ (Debian ...) 12.2.0"
    set(version " ${CMAKE_MATCH_1}")
  endif()
  get_filename_component(compiler_name "${compiler}" NAME)

  if(dialect STREQUAL "cuda")
    # The wheels lay out <top>/lib where nvcc.profile expects <top>/lib64: name it.
    execute_process(COMMAND "${compiler}" --dryrun -c -x cu /dev/null -o /dev/null
                    ERROR_VARIABLE dryrun OUTPUT_QUIET)
    if(dryrun MATCHES "#\\$ TOP=([^\n]*)" AND EXISTS "${CMAKE_MATCH_1}/lib"
       AND NOT EXISTS "${CMAKE_MATCH_1}/lib64")
      list(APPEND flags "-L${CMAKE_MATCH_1}/lib")
    endif()
  endif()
  list(APPEND flags ${extra})
  list(APPEND probe_flags ${extra})

  # Configure-time probe: compile a one-kernel file through the same headers, so a
  # compiler without its runtime headers, or with a host compiler it rejects, is
  # reported here instead of breaking the build.
  set(probe_dir "${CMAKE_CURRENT_BINARY_DIR}/uniccl_kernels_probe_${dialect}")
  file(MAKE_DIRECTORY "${probe_dir}")
  file(WRITE "${probe_dir}/probe.cu"
       "#include \"uc_dialect.h\"\n__global__ void probe(uc_f16 *h, uc_bf16 *b, float *f) {\n"
       "  f[threadIdx.x] = uc_f16_to_float(h[0]) + uc_bf16_to_float(b[0]);\n}\n")
  execute_process(COMMAND "${compiler}" ${probe_flags} -I "${_UC_KERNELS_DIR}" -c probe.cu
                          -o probe.o
                  WORKING_DIRECTORY "${probe_dir}" RESULT_VARIABLE rc
                  OUTPUT_VARIABLE probe_out ERROR_VARIABLE probe_out)
  if(NOT rc EQUAL 0)
    string(REGEX MATCH "[^\n]*(error|Error|ERROR)[^\n]*" first_error "${probe_out}")
    string(STRIP "${first_error}" first_error)
    set(${out_var} "none: ${compiler_name}${version} at ${compiler} cannot compile (${first_error})"
        PARENT_SCOPE)
    return()
  endif()

  add_custom_command(
    OUTPUT "${lib}"
    COMMAND "${compiler}" ${flags} -shared -o "${lib}" "${src}"
    DEPENDS "${src}" ${headers}
    COMMENT "Building uniccl ${dialect} kernels with ${compiler_name}"
    VERBATIM)
  add_custom_target(${target}_build ALL DEPENDS "${lib}")
  add_dependencies(${target} ${target}_build)
  set_target_properties(${target} PROPERTIES UNICCL_KERNELS_LIBRARY "${lib}")
  list(JOIN arch_desc ", " arch_desc)
  set(${out_var} "${compiler_name}${version}: ${arch_desc}" PARENT_SCOPE)
  set(${out_var}_LIBRARY "${lib}" PARENT_SCOPE)
endfunction()
