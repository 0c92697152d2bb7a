"""Every ``UNICCL_*`` environment variable uniccl reads: one table (:data:`VARS`) and its getters.

``get(name)`` reads a variable and parses it by its entry's kind; ``flag``, ``integer``,
``number``, ``size``, ``port``, ``text``, ``choice``, ``path`` and ``names`` do the same and
check the kind.  Unset or empty (blank) gives the entry's default.  A value that does not
parse raises :class:`uniccl.InvalidArgument` (``argument`` the variable's name) naming the
variable, the value and what is allowed -- never a bare ValueError, never a silent default.

Kinds: ``bool`` (exactly 1/0, true/false, yes/no, on/off, any case), ``int``, ``float``,
``size`` (bytes: ``8``, ``1K``, ``64M``, ``1G``, ``2KB``, ``4KiB`` -- the parser ``uniccl bench
-b/-e`` uses), ``port`` (1..65535), ``str``, ``enum`` (one of ``choices``, any case),
``path`` and ``list`` (comma-separated names).

Getters read ``os.environ`` each time: call them where a communicator (or transport, or
command) is set up, never on a call's path.  (A side channel that cannot be served is one
line on stderr at startup: ``warn`` and ``check_writable_dir`` of :mod:`uniccl.observability.log`.)
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from ._errors import InvalidArgument

KINDS = ("bool", "int", "float", "size", "str", "enum", "path", "port", "list")
TRUE = ("1", "true", "yes", "on")
FALSE = ("0", "false", "no", "off")

#: seconds a call, and a job's set-up, may wait for peers unless told otherwise (the one definition)
DEFAULT_TIMEOUT = 120.0

_SIZE_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_SIZE_RE = re.compile(r"\s*(\d+)\s*([kmgtKMGT]?)(?:i?[bB])?\s*")


def parse_size(text) -> int:
    """'8' -> 8, '1K' -> 1024, '64M', '1G', '2KB', '4KiB' (binary units, case-insensitive).
    ValueError otherwise (``uniccl bench``'s -b/-e use it as well as the environment)."""
    m = _SIZE_RE.fullmatch(str(text))
    if not m:
        raise ValueError(f"bad size {text!r}: expected bytes like 8, 1K, 64M or 1G")
    return int(m.group(1)) * _SIZE_UNITS[m.group(2).upper()]


@dataclass(frozen=True)
class Var:
    """One variable: ``kind`` (see KINDS), ``default`` (the parsed value when unset),
    ``meaning`` (one line), ``choices`` (enum), ``minimum``/``maximum``/``multiple`` (numbers),
    ``special`` ((text, value) pairs accepted besides the kind's own values, e.g. -1 "never"),
    ``pattern`` (str: a regular expression the value must match, ``expect`` says it in words),
    ``user`` (False: set by ``uniccl run`` or internal, not something a user sets)."""

    name: str
    kind: str
    default: object
    meaning: str
    choices: tuple = ()
    minimum: float | None = None
    maximum: float | None = None
    multiple: int | None = None
    special: tuple = ()
    pattern: str = ""
    expect: str = ""
    user: bool = True

    def allowed(self) -> str:
        """What the variable accepts, in words (the error messages say it)."""
        k = self.kind
        if k == "bool":
            text = "a boolean: 1, 0, true, false, yes, no, on or off"
        elif k == "enum":
            text = "one of " + ", ".join(self.choices)
        elif k == "size":
            text = "a size in bytes like 4096, 64K, 1M or 1G"
        elif k == "port":
            text = "a TCP port number (1-65535)"
        elif k == "int":
            text = "an integer"
        elif k == "float":
            text = "a number"
        elif k == "list":
            text = "comma-separated names"
        else:
            text = self.expect or "a string"
        bounds = []
        if self.minimum is not None and k != "port":
            bounds.append(f">= {self.minimum:g}")
        if self.maximum is not None and k != "port":
            bounds.append(f"<= {self.maximum:g}")
        if self.multiple:
            bounds.append(f"a multiple of {self.multiple}")
        if bounds:
            text += " (" + ", ".join(bounds) + ")"
        if self.special:
            text += ", or " + " or ".join(repr(t) for t, _ in self.special)
        return text

    def parse(self, text: str):
        """The value of ``text`` (non-empty) for this variable; InvalidArgument when it is not one."""
        raw = text.strip()
        for spelling, value in self.special:
            if raw.lower() == spelling:
                return value
        k = self.kind
        try:
            if k == "bool":
                low = raw.lower()
                if low in TRUE:
                    return True
                if low in FALSE:
                    return False
                raise ValueError
            if k == "enum":
                low = raw.lower()
                if low not in self.choices:
                    raise ValueError
                return low
            if k in ("int", "port"):
                digits = raw[1:] if raw[:1] in ("+", "-") else raw
                if not (digits.isascii() and digits.isdigit()):
                    raise ValueError
                value = int(raw)
            elif k == "float":
                value = float(raw)
                if value != value or value in (float("inf"), float("-inf")):
                    raise ValueError
            elif k == "size":
                value = parse_size(raw)
            elif k == "list":
                return [n.strip() for n in raw.split(",") if n.strip()]
            else:  # str, path: as given (paths keep their spaces)
                if self.pattern and not re.fullmatch(self.pattern, raw):
                    raise ValueError
                return text if k == "path" else raw
        except ValueError:
            raise self.error(text) from None
        if (
            (self.minimum is not None and value < self.minimum)
            or (self.maximum is not None and value > self.maximum)
            or (self.multiple and value % self.multiple)
        ):
            raise self.error(text)
        return value

    def error(self, text: str, why: str = "") -> InvalidArgument:
        return InvalidArgument(
            f"{self.name}={text!r} {why or 'is not valid'}: expected {self.allowed()}", op="init", argument=self.name
        )


def _v(name, kind, default, meaning, **kw) -> Var:
    return Var(name, kind, default, meaning, **kw)


#: Every UNICCL_* variable the package reads (or ``uniccl run`` sets for its ranks).
VARS: dict[str, Var] = {
    v.name: v
    for v in (
        # plugins
        _v("UNICCL_PLATFORM", "list", [], "use the first available of these plugins, in this order (fail if none is)"),
        _v(
            "UNICCL_PLUGINS",
            "str",
            "",
            "never load these plugins (^name[,name...]); ^nccl keeps device buffers off the native library",
            pattern=r"\^\s*[^\s,^][^^]*",
            expect="^name[,name...] (the plugins not to load)",
        ),
        _v(
            "UNICCL_PLATFORMS",
            "list",
            [],
            "set by `uniccl run --platforms P,Q`: rank r gets UNICCL_PLATFORM=P[r % len]",
            user=False,
        ),
        _v(
            "UNICCL_NVIDIA_KERNELS",
            "path",
            None,
            "the nvidia plugin's reduction kernels library (default: the built one)",
        ),
        _v(
            "UNICCL_METAX_KERNELS",
            "path",
            None,
            "the metax plugin's reduction kernels library (default: the built one)",
        ),
        _v(
            "UNICCL_ILUVATAR_KERNELS",
            "path",
            None,
            "the iluvatar plugin's reduction kernels library (default: the built one)",
        ),
        _v(
            "UNICCL_CAMBRICON_KERNELS",
            "path",
            None,
            "the cambricon plugin's reduction kernels library (default: the built one)",
        ),
        _v(
            "UNICCL_MOORE_KERNELS",
            "path",
            None,
            "the moore plugin's reduction kernels library (default: the built one)",
        ),
        # bootstrap, transports, algorithms
        _v(
            "UNICCL_BOOTSTRAP",
            "enum",
            None,
            "how uniccl.init() finds its peers (default: MPI under an MPI launcher, TCP under `uniccl run`)",
            choices=("mpi", "tcp"),
        ),
        _v("UNICCL_TRANSPORT", "enum", None, "force the data transport", choices=("shm", "mpi", "tcp")),
        _v(
            "UNICCL_ALGO",
            "str",
            "",
            "force algorithms per collective: 'all_reduce:ring;broadcast:tree' (* for all)",
            expect="'collective:algorithm[;collective:algorithm...]'",
        ),
        _v(
            "UNICCL_TUNER_TABLE",
            "path",
            None,
            "the tuner's alpha, beta, gamma measured on this cluster (a JSON file `uniccl bench --fit-model` writes)",
        ),
        _v(
            "UNICCL_CHUNK_BYTES",
            "size",
            512 * 1024,
            "pipeline chunk size of the algorithms (at least 4096 is used)",
            minimum=0,
        ),
        _v(
            "UNICCL_HOST_ADDR",
            "str",
            None,
            "address the unique-id rendezvous and TCP ranks advertise",
            expect="a host address",
        ),
        _v(
            "UNICCL_TIMEOUT",
            "float",
            DEFAULT_TIMEOUT,
            "seconds a call may wait for its peers (0: no limit)",
            minimum=0,
            maximum=1e9,
        ),
        _v(
            "UNICCL_INIT_TIMEOUT",
            "float",
            DEFAULT_TIMEOUT,
            "seconds the ranks of a `uniccl run` job wait for each other at init",
            minimum=0,
        ),
        _v("UNICCL_TCP_CHECKSUM", "bool", True, "CRC-32C of every TCP message, with retransmission"),
        _v(
            "UNICCL_TCP_RETAIN_BYTES", "size", 64 << 20, "bytes of sent TCP messages kept for retransmission", minimum=0
        ),
        _v(
            "UNICCL_TCP_TLS",
            "bool",
            False,
            "TLS 1.3 on every TCP connection of the mesh (pinned ephemeral certificates)",
        ),
        _v("UNICCL_SHM_CHECKSUM", "bool", False, "CRC-32C of every region copied out of a peer's shared-memory slot"),
        _v(
            "UNICCL_SHM_SLOT_BYTES",
            "size",
            1 << 20,
            "size of each shared-memory slot (two per rank)",
            minimum=4096,
            maximum=1 << 30,
            multiple=4096,
        ),
        _v(
            "UNICCL_SHM_CMA",
            "bool",
            None,
            "single-copy reads (process_vm_readv) on shared memory: auto (unset) where measured faster "
            "than the slots (at open, then as the transfers go), 1 wherever they may be used, 0 never (slot copies)",
            special=(("auto", None),),
        ),
        _v("UNICCL_SHM_SMALL_BYTES", "size", None, "shared-memory tuning: the largest one-round reduction", minimum=0),
        _v(
            "UNICCL_SHM_CMA_MIN_BYTES",
            "size",
            None,
            "shared-memory tuning: the smallest single-copy transfer",
            minimum=0,
        ),
        _v(
            "UNICCL_SHM_CMA_REDUCE_MIN_BYTES",
            "size",
            None,
            "shared-memory tuning: the smallest single-copy reduction (-1: never)",
            minimum=0,
            special=(("-1", -1),),
        ),
        _v(
            "UNICCL_SHM_CMA_BCAST_MAX_BYTES",
            "size",
            None,
            "shared-memory tuning: the smallest broadcast through the slots where single-copy reads are on (-1: none;"
            " default 32 MiB, none where the calls' speeds choose the path)",
            minimum=0,
            special=(("-1", -1),),
        ),
        _v(
            "UNICCL_SHM_NT_MIN_BYTES",
            "size",
            None,
            "shared-memory tuning: the smallest non-temporal output copy",
            minimum=0,
        ),
        _v("UNICCL_SHM_SPIN_NS", "int", None, "shared-memory tuning: nanoseconds a wait spins", minimum=0),
        _v(
            "UNICCL_SHM_YIELD_NS",
            "int",
            None,
            "shared-memory tuning: nanoseconds a wait yields before it sleeps",
            minimum=0,
        ),
        # faults
        _v("UNICCL_DUMP_DIR", "path", None, "directory each rank writes its flight recorder to on a failure"),
        _v("UNICCL_FLIGHT_RECORDER", "int", 2048, "operations each communicator remembers (0: off)", minimum=0),
        _v(
            "UNICCL_FAULT_INJECT",
            "str",
            "",
            "tests only: injected faults (flip=P,drop=P,delay=P:S,shm_flip=P,kill_at=N,"
            "kill_rank=R,slow=S,slow_rank=R,seed=S)",
            expect="'fault=value[,fault=value...]'",
        ),
        # visibility
        _v("UNICCL_TELEMETRY", "bool", True, "per-call counters (comm.stats())"),
        _v("UNICCL_TRACE", "path", None, "directory for a Perfetto trace and the stats of every rank, written at exit"),
        _v(
            "UNICCL_METRICS_PORT",
            "port",
            None,
            "serve Prometheus metrics on this port + local rank",
            minimum=1,
            maximum=65535,
        ),
        _v("UNICCL_STATUS_DIR", "path", None, "directory each rank writes its live status to, for `uniccl top`"),
        _v(
            "UNICCL_DEBUG",
            "enum",
            None,
            "log level of uniccl's choices to stderr",
            choices=("warn", "warning", "info", "debug", "trace"),
            special=(("0", None), ("off", None)),
        ),
        _v("UNICCL_DEBUG_FILE", "path", None, "log file instead of stderr (%h host, %p pid, %r rank)"),
        # torch
        _v(
            "UNICCL_TORCH_ORDER",
            "enum",
            "gloo",
            "order of float sums of the torch backend: gloo's, or uniccl's own",
            choices=("gloo", "native"),
        ),
        _v("UNICCL_TORCH_AUTOLOAD", "bool", False, '`import torch` registers the "uniccl" torch.distributed backend'),
        # set by `uniccl run` for every rank
        _v("UNICCL_RANK", "int", None, "this process's rank (set by `uniccl run`)", minimum=0, user=False),
        _v("UNICCL_WORLD_SIZE", "int", None, "ranks of the job (set by `uniccl run`)", minimum=1, user=False),
        _v(
            "UNICCL_LOCAL_RANK",
            "int",
            None,
            "rank among the job's processes on this host (set by `uniccl run`)",
            minimum=0,
            user=False,
        ),
        _v(
            "UNICCL_LOCAL_SIZE",
            "int",
            None,
            "the job's processes on this host (set by `uniccl run`)",
            minimum=1,
            user=False,
        ),
        _v(
            "UNICCL_NODE_RANK", "int", None, "this host's index in the job (set by `uniccl run`)", minimum=0, user=False
        ),
        _v("UNICCL_NNODES", "int", None, "hosts of the job (set by `uniccl run`)", minimum=1, user=False),
        _v(
            "UNICCL_MAX_RESTARTS",
            "int",
            None,
            "`uniccl run --enable-recovery`'s --max-restarts (0: a lost rank is not started again; unset: no recovery)",
            minimum=0,
            user=False,
        ),
        _v(
            "UNICCL_RESTART_COUNT",
            "int",
            None,
            "how many times `uniccl run --max-restarts` started this rank's command before (unset: the first start)",
            minimum=1,
            user=False,
        ),
        _v(
            "UNICCL_RENDEZVOUS",
            "str",
            None,
            "host:port where the ranks of a `uniccl run` job meet",
            pattern=r".+:\d+",
            expect="host:port",
            user=False,
        ),
        _v(
            "UNICCL_JOB_SECRET",
            "str",
            None,
            "the job's shared secret (hex) for the rendezvous",
            pattern=r"([0-9a-fA-F]{2})+",
            expect="hex digits",
            user=False,
        ),
        _v("UNICCL_PREFIX", "bool", True, "`uniccl run` prefixes each output line with its rank", user=False),
        _v("UNICCL_BENCH_CHILD", "bool", False, "`uniccl bench` ranks it relaunched under mpiexec", user=False),
    )
}
for _var in VARS.values():  # compiled once, with the module (re caches them), not at a rank's init
    if _var.pattern:
        re.compile(_var.pattern)


def spec(name: str) -> Var:
    try:
        return VARS[name]
    except KeyError:
        raise KeyError(f"{name} is not in uniccl._env.VARS") from None


def raw(name: str, environ=None) -> str | None:
    """The variable's text as set (None: unset or blank)."""
    value = (os.environ if environ is None else environ).get(name)
    return value if value is not None and value.strip() else None


def is_set(name: str, environ=None) -> bool:
    return raw(name, environ) is not None


def get(name: str, environ=None):
    """The variable parsed by its entry (its default when unset or blank)."""
    v = spec(name)
    text = raw(name, environ)
    if text is None:
        d = v.default
        return list(d) if isinstance(d, list) else d
    return v.parse(text)


def check_all(environ=None) -> None:
    """Parse every variable of the table that is set: InvalidArgument for the first bad one.
    A communicator's creation calls it, so a bad value is an error at startup even where the
    variable's own use comes later, or not at all in this job (a single rank's shm settings)."""
    env = os.environ if environ is None else environ
    for name, v in VARS.items():
        text = env.get(name)
        if text is not None and text.strip():
            v.parse(text)


def _typed(kinds):
    def getter(name: str, environ=None):
        kind = spec(name).kind
        if kind not in kinds:
            raise TypeError(f"{name} is a {kind} variable, not {'/'.join(kinds)}")
        return get(name, environ)

    getter.__name__ = kinds[0]
    getter.__doc__ = f"{'/'.join(kinds)} variable: see get()."
    return getter


flag = _typed(("bool",))
integer = _typed(("int",))
number = _typed(("float", "int"))
size = _typed(("size",))
port = _typed(("port",))
text = _typed(("str",))
choice = _typed(("enum",))
path = _typed(("path",))
names = _typed(("list",))
