"""The shared CUDA-dialect reduction kernels (plugins/shared/cuda_kernels).

* host: reduce.cu built with g++ and host_compat.h, its launches run as loops on
  the CPU, checked for every dtype x op and scale against numpy references;
* nvcc: the CMake function builds reduce.cu for sm_80, sm_90 and compute_90 PTX
  (skipped where no nvcc is found) and reports the other dialects' compilers missing;
* gpu: the host checks again on the nvcc build, where a CUDA GPU is usable.
"""

import ctypes
import glob
import re
import shutil
import subprocess
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
KDIR = ROOT / "plugins" / "shared" / "cuda_kernels"

# uniccl's DType and ReduceOp codes (checked against uniccl._types below)
NUMPY = {
    0: np.int8,
    1: np.uint8,
    2: np.int32,
    3: np.uint32,
    4: np.int64,
    5: np.uint64,
    6: np.float16,
    7: np.float32,
    8: np.float64,
    9: ml_dtypes.bfloat16,
    10: np.int16,
    11: np.uint16,
}
NAMES = {code: np.dtype(t).name for code, t in NUMPY.items()}
INTS = [c for c, t in NUMPY.items() if np.dtype(t).kind in "iu"]
FLOATS = [c for c in NUMPY if c not in INTS]
HALFS = [6, 9]
SUM, PROD, MAX, MIN = range(4)
OPS = {"sum": SUM, "prod": PROD, "max": MAX, "min": MIN}
EINVAL = -1
# Odd sizes around every pack width (16 bytes: 16, 8, 4 or 2 elements)
SIZES = [0, 1, 3, 7, 15, 17, 33, 1003, 65537]
GRID_THREADS = 2048 * 256  # reduce.cu's largest grid (kMaxBlocks x kThreads)


def _bind(lib):
    lib.uniccl_cuda_reduce.argtypes = [
        ctypes.c_void_p,
        ctypes.c_void_p,
        ctypes.c_void_p,
        ctypes.c_size_t,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_void_p,
    ]
    lib.uniccl_cuda_scale.argtypes = [
        ctypes.c_void_p,
        ctypes.c_void_p,
        ctypes.c_size_t,
        ctypes.c_int,
        ctypes.c_ulonglong,
        ctypes.c_void_p,
    ]
    lib.uniccl_cuda_kernels_info.restype = ctypes.c_char_p
    return lib


# ---------------------------------------------------------------- memory backends
class HostMemory:
    """Kernels built with host_compat.h work on host memory, synchronously."""

    stream = None

    def __init__(self, lib):
        self.lib = lib
        self._keep = []

    def alloc(self, nbytes):
        buf = np.zeros(nbytes + 256, np.uint8)
        self._keep.append(buf)
        return buf.ctypes.data + (-buf.ctypes.data) % 256  # aligned like cudaMalloc

    def upload(self, ptr, data: bytes):
        ctypes.memmove(ptr, data, len(data))

    def download(self, ptr, nbytes) -> bytes:
        return ctypes.string_at(ptr, nbytes)

    def sync(self):
        pass

    def free_all(self):
        self._keep.clear()


class CudaMemory:
    """Device memory through the toolkit's libcudart (the kernels library has its
    own static runtime: both share the device's primary context)."""

    def __init__(self, lib, cudart):
        self.lib, self.rt = lib, cudart
        self._ptrs = []
        stream = ctypes.c_void_p()
        self._check(self.rt.cudaStreamCreate(ctypes.byref(stream)))
        self.stream = stream.value  # launches go to a real stream, not the default one

    def _check(self, rc):
        if rc:
            self.rt.cudaGetErrorString.restype = ctypes.c_char_p
            raise RuntimeError(f"CUDA error {rc}: {self.rt.cudaGetErrorString(rc).decode()}")

    def alloc(self, nbytes):
        p = ctypes.c_void_p()
        self._check(self.rt.cudaMalloc(ctypes.byref(p), ctypes.c_size_t(max(nbytes, 1))))
        self._ptrs.append(p.value)
        return p.value

    def upload(self, ptr, data: bytes):
        self._check(self.rt.cudaMemcpy(ctypes.c_void_p(ptr), data, ctypes.c_size_t(len(data)), 1))

    def download(self, ptr, nbytes) -> bytes:
        out = ctypes.create_string_buffer(nbytes)
        self._check(self.rt.cudaMemcpy(out, ctypes.c_void_p(ptr), ctypes.c_size_t(nbytes), 2))
        return out.raw

    def sync(self):
        self._check(self.rt.cudaStreamSynchronize(ctypes.c_void_p(self.stream)))
        self._check(self.rt.cudaDeviceSynchronize())

    def free_all(self):
        for p in self._ptrs:
            self.rt.cudaFree(ctypes.c_void_p(p))
        self._ptrs.clear()


# ---------------------------------------------------------------- builds
@pytest.fixture(scope="module")
def host_lib(tmp_path_factory):
    cxx = shutil.which("g++") or shutil.which("c++")
    if not cxx:
        pytest.skip("no g++ to build the host-compat kernels")
    out = tmp_path_factory.mktemp("host") / "libuniccl_kernels_host.so"
    # -Werror: the kernel source must stay warning-clean
    cmd = [
        cxx,
        "-std=c++17",
        "-O2",
        "-Wall",
        "-Wextra",
        "-Werror",
        "-fPIC",
        "-shared",
        "-x",
        "c++",
        "-include",
        str(KDIR / "host_compat.h"),
        str(KDIR / "reduce.cu"),
        "-o",
        str(out),
    ]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    return _bind(ctypes.CDLL(str(out)))


@pytest.fixture(scope="module")
def cmake_build(tmp_path_factory):
    """The standalone CMake project configured for every device dialect: the CMake
    function finds nvcc (.venv-cuda from scripts/check_cuda_kernels.sh, CUDA_HOME,
    PATH, PyPI wheels, /usr/local/cuda) or says where it looked."""
    cmake = shutil.which("cmake")
    if not cmake:
        pytest.skip("no cmake")
    build = tmp_path_factory.mktemp("cmake")
    subprocess.run(
        [cmake, "-S", str(KDIR), "-B", str(build), "-DUNICCL_KERNELS_DIALECTS=cuda;ivcore;maca;musa"],
        check=True,
        capture_output=True,
        text=True,
    )
    info = {}
    for line in (build / "kernels-info.txt").read_text().splitlines():
        dialect, desc, lib, compiler = line.split("\t")
        info[dialect] = (desc, lib, compiler)
    return cmake, build, info


@pytest.fixture(scope="module")
def nvcc_lib(cmake_build):
    cmake, build, info = cmake_build
    desc, lib, nvcc = info["cuda"]
    if not lib:
        pytest.skip(f"no nvcc build: {desc} (scripts/check_cuda_kernels.sh installs one)")
    proc = subprocess.run(
        [cmake, "--build", str(build), "--target", "uniccl_kernels_cuda_build"], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert Path(lib).is_file()
    return nvcc, desc, lib


def _cudart(nvcc):
    """The toolkit's libcudart next to nvcc (wheel or /usr/local/cuda layout)."""
    top = Path(nvcc).resolve().parent.parent
    text = subprocess.run(
        [nvcc, "--dryrun", "-c", "-x", "cu", "/dev/null", "-o", "/dev/null"], capture_output=True, text=True
    ).stderr
    m = re.search(r"#\$ TOP=(.*)", text)
    if m:
        top = Path(m.group(1).strip())
    for d in ("lib64", "lib", "targets/x86_64-linux/lib"):
        hits = sorted(glob.glob(str(top / d / "libcudart.so*")))
        if hits:
            return hits[0]
    return None


@pytest.fixture(scope="module", params=["host", "gpu"])
def mem(request):
    if request.param == "host":
        m = HostMemory(request.getfixturevalue("host_lib"))
    else:
        nvcc, _, lib = request.getfixturevalue("nvcc_lib")
        path = _cudart(nvcc)
        if not path:
            pytest.skip("no libcudart next to nvcc")
        rt = ctypes.CDLL(path)
        count = ctypes.c_int(0)
        rc = rt.cudaGetDeviceCount(ctypes.byref(count))
        if rc or count.value == 0:
            pytest.skip(f"no usable CUDA GPU (cudaGetDeviceCount: error {rc}, {count.value} devices)")
        m = CudaMemory(_bind(ctypes.CDLL(lib)), rt)
    yield m
    m.free_all()


# ---------------------------------------------------------------- data and references
def specials(code):
    if code == 9:
        big, tiny = 3.3895313892515355e38, 9.183549615799121e-41
    else:
        fi = np.finfo(NUMPY[code])
        big, tiny = float(fi.max), float(fi.smallest_subnormal)
    return [np.nan, np.inf, -np.inf, 0.0, -0.0, big, -big, tiny, -tiny, 1.0, -1.0]


def operand(rng, code, n):
    nd = np.dtype(NUMPY[code])
    if code in INTS:
        info = np.iinfo(nd)
        return rng.integers(info.min, info.max, size=n, dtype=nd, endpoint=True)
    values = (rng.standard_normal(n) * 50).astype(nd)
    if n:
        s = np.array(specials(code)).astype(nd)
        k = min(n, 2 * len(s))
        values[rng.integers(0, n, size=k)] = np.resize(s, k)
    return values


def ref_reduce(a, b, code, op):
    nd = np.dtype(NUMPY[code])
    with np.errstate(all="ignore"):
        if code in INTS:
            if op in (MAX, MIN):
                return (np.maximum if op == MAX else np.minimum)(a, b)
            # exact modulo 2**64 in a 64-bit type, then wrapped to the width by the cast
            wide = np.uint64 if nd.kind == "u" or nd.itemsize == 8 else np.int64
            x, y = a.astype(wide), b.astype(wide)
            return (x + y if op == SUM else x * y).astype(nd)
        # float64 then one rounding: equal to computing in float32 (or the type) and
        # rounding, since float64 has more than twice float32's precision (and float32
        # more than twice float16's and bfloat16's) plus two bits
        x, y = a.astype(np.float64), b.astype(np.float64)
        fn = {SUM: np.add, PROD: np.multiply, MAX: np.maximum, MIN: np.minimum}[op]
        return fn(x, y).astype(nd)


def ref_scale(src, code, divisor):
    nd = np.dtype(NUMPY[code])
    if code in INTS:  # Python ints: exact, truncating toward zero
        return np.array([abs(v) // divisor * (1 if v >= 0 else -1) for v in src.tolist()], nd)
    q = float(np.float64(divisor) if code == 8 else np.float32(divisor))  # the kernel's divisor
    with np.errstate(all="ignore"):
        return (src.astype(np.float64) / q).astype(nd)


def assert_same(got, ref):
    """Bit-exact up to NaN payloads: NaN positions, values and signs of zeros."""
    if got.dtype.kind in "iu":
        np.testing.assert_array_equal(got, ref)
        return
    with np.errstate(invalid="ignore"):  # ml_dtypes warns casting a bfloat16 NaN
        g, r = got.astype(np.float64), ref.astype(np.float64)
    nan = np.isnan(r)
    np.testing.assert_array_equal(np.isnan(g), nan)
    np.testing.assert_array_equal(g[~nan], r[~nan])
    np.testing.assert_array_equal(np.signbit(g[~nan]), np.signbit(r[~nan]))


GUARD = 0x5A


def run_kernel(mem, code, n, inputs, call, layout):
    """Place `inputs` and the output in memory with `layout`, run `call(dst, *srcs)`,
    check it returned 0 and left every byte around dst alone; return dst's values.

    layout: aligned (all 16-byte aligned), offset (all one element past that: a
    scalar head first), mixed (first input one element off: no packs at all), or
    in_place (dst is the first input)."""
    nd = np.dtype(NUMPY[code])
    size = nd.itemsize
    nbytes = n * size
    shift = {"aligned": [0, 0, 0], "offset": [1, 1, 1], "mixed": [0, 1, 0], "in_place": [0, 0, 0]}[layout]
    # dst gets a guard of one element either side
    dst_base = mem.alloc(nbytes + 2 * size + 16)
    dst = dst_base + 16 + shift[0] * size
    mem.upload(dst_base, bytes([GUARD]) * (nbytes + 2 * size + 16))
    srcs = []
    for i, arr in enumerate(inputs):
        if layout == "in_place" and i == 0:
            mem.upload(dst, arr.tobytes())
            srcs.append(dst)
            continue
        p = mem.alloc(nbytes + 16) + shift[i + 1] * size
        mem.upload(p, arr.tobytes())
        srcs.append(p)
    rc = call(dst, *srcs)
    mem.sync()
    assert rc == 0
    raw = mem.download(dst_base, nbytes + 2 * size + 16)
    lo = 16 + shift[0] * size
    assert set(raw[:lo]) <= {GUARD} and set(raw[lo + nbytes :]) <= {GUARD}, "wrote outside dst"
    return np.frombuffer(raw[lo : lo + nbytes], nd).copy()


def reduce_on(mem, code, op, a, b, layout="aligned"):
    return run_kernel(
        mem,
        code,
        a.size,
        [a, b],
        lambda d, x, y: mem.lib.uniccl_cuda_reduce(d, x, y, a.size, code, op, mem.stream),
        layout,
    )


def scale_on(mem, code, divisor, src, layout="aligned"):
    return run_kernel(
        mem,
        code,
        src.size,
        [src],
        lambda d, s: mem.lib.uniccl_cuda_scale(d, s, src.size, code, divisor, mem.stream),
        layout,
    )


# ---------------------------------------------------------------- kernels vs numpy
@pytest.mark.parametrize("layout", ["aligned", "offset", "mixed", "in_place"])
@pytest.mark.parametrize("op", list(OPS.values()), ids=list(OPS))
@pytest.mark.parametrize("code", list(NUMPY), ids=NAMES.get)
def test_reduce_matches_numpy(mem, code, op, layout):
    for n in SIZES:
        rng = np.random.default_rng([code, op, n])
        a, b = operand(rng, code, n), operand(rng, code, n)
        assert_same(reduce_on(mem, code, op, a, b, layout), ref_reduce(a, b, code, op))


@pytest.mark.parametrize("code", list(NUMPY), ids=NAMES.get)
def test_large_counts(mem, code):
    # past the grid in threads for the scalar path (inputs not co-aligned) and, for
    # one dtype of each pack width, in 16-byte packs: the grid-stride loops iterate
    size = np.dtype(NUMPY[code]).itemsize
    cases = [("mixed", 3 * GRID_THREADS // 2 + 5)]
    if code in (0, 6, 7, 8):
        cases.append(("aligned", 3 * GRID_THREADS * (16 // size) // 2 + 5))
    for layout, n in cases:
        rng = np.random.default_rng([code, n])
        a, b = operand(rng, code, n), operand(rng, code, n)
        for op in (SUM, MAX):
            assert_same(reduce_on(mem, code, op, a, b, layout), ref_reduce(a, b, code, op))


@pytest.mark.parametrize("layout", ["aligned", "mixed"])
def test_counts_past_int32_indices(mem, layout):
    """2**31 + 33 elements: indices and offsets must be 64-bit (GPU only: 6 GiB)."""
    if isinstance(mem, HostMemory):
        pytest.skip("GPU only: 6 GiB and minutes of host emulation")
    n = 2**31 + 33
    a = (np.arange(n, dtype=np.uint64) % 251).astype(np.uint8)
    b = np.full(n, 7, np.uint8)
    got = reduce_on(mem, 1, SUM, a, b, layout)
    assert np.array_equal(got, a + b)


@pytest.mark.parametrize(
    "code, x, y, op, expected",
    [
        (0, 127, 1, SUM, -128),
        (1, 255, 1, SUM, 0),
        (10, 300, 300, PROD, 90000 - 65536),
        (11, 65535, 65535, PROD, 1),  # 65535 * 65535 overflows a signed int: must not be UB
        (2, 2**31 - 1, 2, PROD, -2),
        (3, 2**32 - 1, 2, SUM, 1),
        (4, -(2**63), -1, SUM, 2**63 - 1),
        (5, 2**64 - 1, 2**64 - 1, PROD, 1),
        (4, -(2**63), -1, PROD, -(2**63)),
    ],
)
def test_integer_wraparound(mem, code, x, y, op, expected):
    a, b = np.full(37, x, NUMPY[code]), np.full(37, y, NUMPY[code])
    assert reduce_on(mem, code, op, a, b).tolist() == [expected] * 37


@pytest.mark.parametrize("op", [MAX, MIN], ids=["max", "min"])
@pytest.mark.parametrize("code", FLOATS, ids=NAMES.get)
def test_max_min_propagate_nan_and_keep_infinities(mem, code, op):
    nd = NUMPY[code]
    a = np.array([np.nan, 1.0, np.nan, -np.inf, np.inf, -np.inf] * 7, nd)
    b = np.array([1.0, np.nan, np.nan, np.nan, -np.inf, np.inf] * 7, nd)
    got = reduce_on(mem, code, op, a, b).astype(np.float64).reshape(7, 6)
    assert np.isnan(got[:, :4]).all()
    assert (got[:, 4:] == (np.inf if op == MAX else -np.inf)).all()


@pytest.mark.parametrize("code", HALFS, ids=NAMES.get)
def test_16bit_conversions_exhaustive(mem, code):
    """Every 16-bit pattern: max(x, x) is x, and x + y for y around the smallest
    steps rounds to nearest even in every binade (ties included)."""
    nd = np.dtype(NUMPY[code])
    x = np.arange(65536, dtype=np.uint16).view(nd)
    assert_same(reduce_on(mem, code, MAX, x, x), x)
    fi = (np.float64(2.0**-133), 2.0**-126) if code == 9 else (2.0**-24, 2.0**-14)
    for y in (fi[0], -fi[0], 3 * fi[0], fi[1], 1 / 3, 1024.0, -3.0e4):
        yy = np.full(65536, y, np.float64).astype(nd)
        assert_same(reduce_on(mem, code, SUM, x, yy), ref_reduce(x, yy, code, SUM))


@pytest.mark.parametrize("layout", ["aligned", "offset", "in_place"])
@pytest.mark.parametrize("code", list(NUMPY), ids=NAMES.get)
def test_scale_matches_reference(mem, code, layout):
    # 2**31 + 11 makes the narrow integers divide in 64 bits, and floats round it
    for divisor in (1, 2, 3, 7, 1000, 2**31 + 11, 2**40):
        for n in (1, 17, 1003):
            src = operand(np.random.default_rng([code, divisor, n]), code, n)
            assert_same(scale_on(mem, code, divisor, src, layout), ref_scale(src, code, divisor))


def test_scale_truncates_toward_zero(mem):
    src = np.array([-7, 7, -1, -128, 127, -6], np.int8)
    assert scale_on(mem, 0, 2, src).tolist() == [-3, 3, 0, -64, 63, -3]
    big = np.array([-(2**63), 2**63 - 1, -5, 5], np.int64)
    assert scale_on(mem, 4, 3, big).tolist() == [-(2**63 // 3), (2**63 - 1) // 3, -1, 1]
    u = np.array([2**64 - 1, 7], np.uint64)
    assert scale_on(mem, 5, 2**63 - 1, u).tolist() == [2, 0]


def test_invalid_arguments_touch_nothing(mem):
    lib = mem.lib
    p = mem.alloc(64)
    mem.upload(p, bytes([GUARD]) * 64)
    for dtype, op in [(12, SUM), (-1, SUM), (7, 4), (7, -1)]:
        assert lib.uniccl_cuda_reduce(p, p, p, 4, dtype, op, mem.stream) == EINVAL
    for dtype, divisor in [(7, 0), (12, 2), (4, 2**63)]:
        assert lib.uniccl_cuda_scale(p, p, 4, dtype, divisor, mem.stream) == EINVAL
    # count 0 launches nothing, so even NULL pointers are fine
    assert lib.uniccl_cuda_reduce(None, None, None, 0, 7, SUM, mem.stream) == 0
    assert lib.uniccl_cuda_scale(None, None, 0, 7, 2, mem.stream) == 0
    mem.sync()
    assert mem.download(p, 64) == bytes([GUARD]) * 64


_UBSAN_DRIVER = """
import ctypes, sys
import numpy as np
lib = ctypes.CDLL(sys.argv[1])
lib.uniccl_cuda_reduce.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_size_t, ctypes.c_int,
                                                          ctypes.c_int, ctypes.c_void_p]
lib.uniccl_cuda_scale.argtypes = [ctypes.c_void_p] * 2 + [ctypes.c_size_t, ctypes.c_int,
                                                          ctypes.c_ulonglong, ctypes.c_void_p]
for code, name in [(0, "int8"), (1, "uint8"), (10, "int16"), (11, "uint16"), (2, "int32"),
                   (3, "uint32"), (4, "int64"), (5, "uint64")]:
    info = np.iinfo(name)
    edges = np.array([info.min, info.min + 1, -1 if info.min else 2, 0, 1, info.max - 1,
                      info.max], name)
    a, b = np.repeat(edges, edges.size), np.tile(edges, edges.size)  # every pair
    dst = np.empty_like(a)
    for op in range(4):
        assert lib.uniccl_cuda_reduce(dst.ctypes.data, a.ctypes.data, b.ctypes.data, a.size,
                                      code, op, None) == 0
    for divisor in (1, 2, 3, 2**31 - 1, 2**31 + 11, 2**63 - 1):
        assert lib.uniccl_cuda_scale(dst.ctypes.data, a.ctypes.data, a.size, code, divisor,
                                     None) == 0
"""


def test_no_undefined_behaviour_at_integer_extremes(tmp_path):
    """Wrap-around must come from unsigned arithmetic, not signed overflow (undefined,
    though it happens to wrap on x86): the host build under UBSan, which aborts on
    any undefined behaviour, runs every op and scale on every pair of extremes."""
    cxx = shutil.which("g++")
    if not cxx:
        pytest.skip("no g++")
    lib = tmp_path / "libuc_ubsan.so"
    build = subprocess.run(
        [
            cxx,
            "-std=c++17",
            "-O1",
            "-fsanitize=undefined",
            "-fno-sanitize-recover=all",
            "-fPIC",
            "-shared",
            "-x",
            "c++",
            "-include",
            str(KDIR / "host_compat.h"),
            str(KDIR / "reduce.cu"),
            "-o",
            str(lib),
        ],
        capture_output=True,
        text=True,
    )
    if build.returncode:
        pytest.skip(f"no UBSan here: {build.stderr.strip()[:200]}")
    run = subprocess.run([sys.executable, "-c", _UBSAN_DRIVER, str(lib)], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr


def test_host_info(host_lib):
    assert host_lib.uniccl_cuda_kernels_info().decode().startswith("host emulation (g++")


def test_codes_match_uniccl():
    types = pytest.importorskip("uniccl._types")
    assert {int(d): types.numpy_dtype(d) for d in types.DType} == {c: np.dtype(t) for c, t in NUMPY.items()}
    assert [int(types.ReduceOp[n.upper()]) for n in OPS] == list(OPS.values())


# ---------------------------------------------------------------- the device builds
def test_cmake_reports_each_dialect(cmake_build):
    _, _, info = cmake_build
    for dialect, name in [("ivcore", "CoreX clang++"), ("maca", "mxcc"), ("musa", "mcc")]:
        desc, lib, compiler = info[dialect]
        assert desc.startswith(f"none: {name} not found (searched: "), desc
        assert lib == compiler == ""
    desc, lib, compiler = info["cuda"]
    if lib:
        assert re.fullmatch(r"nvcc \d+\.\d+: sm_80, sm_90, compute_90 PTX", desc), desc
        assert Path(compiler).is_file()
    else:  # never a failed configure: a reason instead
        assert re.match(r"none: nvcc (not found \(searched: |.* cannot compile \()", desc), desc


def test_nvcc_builds_sm80_sm90_and_ptx(nvcc_lib):
    nvcc, desc, lib = nvcc_lib
    kernels = _bind(ctypes.CDLL(lib))
    info = kernels.uniccl_cuda_kernels_info().decode()
    assert info.startswith("nvcc ") and info.endswith("arch list 800,900"), info
    cuobjdump = Path(nvcc).resolve().parent / "cuobjdump"
    if not cuobjdump.exists():
        cuobjdump = shutil.which("cuobjdump")
    if not cuobjdump:
        return  # the build and its info line are all there is to check
    listing = subprocess.run(
        [str(cuobjdump), "--list-elf", "--list-ptx", lib], capture_output=True, text=True, check=True
    ).stdout
    assert "sm_80.cubin" in listing and "sm_90.cubin" in listing and "sm_90.ptx" in listing
    # cudart_static brings cubins of its own: count our kernels in each
    usage = subprocess.run(
        [str(cuobjdump), "--dump-resource-usage", lib], capture_output=True, text=True, check=True
    ).stdout
    per_arch, arch = {}, None
    for line in usage.splitlines():
        m = re.match(r"arch = (sm_\d+)", line.strip())
        arch = m.group(1) if m else arch
        if "Function" in line and "uc_map_kernel" in line:
            per_arch[arch] = per_arch.get(arch, 0) + 1
    # 12 dtypes x 4 ops, 12 scales, and 6 narrow integers' 64-bit-divisor scales
    assert per_arch == {"sm_80": 66, "sm_90": 66}, per_arch
    ptx = subprocess.run([str(cuobjdump), "-ptx", lib], capture_output=True, text=True, check=True).stdout
    assert ".target sm_90" in ptx
    assert len(re.findall(r"\.entry \S*uc_map_kernel", ptx)) == 66


def test_nvcc_build_reports_launch_errors_without_gpu(nvcc_lib):
    """No GPU here: a launch fails and its error code comes back (never a crash)."""
    nvcc, _, lib = nvcc_lib
    path = _cudart(nvcc)
    if path:
        count = ctypes.c_int(0)
        if ctypes.CDLL(path).cudaGetDeviceCount(ctypes.byref(count)) == 0 and count.value:
            pytest.skip("a GPU is present: the gpu-backed tests cover launches")
    kernels = _bind(ctypes.CDLL(lib))
    assert kernels.uniccl_cuda_reduce(None, None, None, 8, 7, SUM, None) > 0
    assert kernels.uniccl_cuda_scale(None, None, 8, 7, 2, None) > 0
