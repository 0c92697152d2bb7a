"""The nodes of a multi-node job and where they come from.

Three sources give the same ``Node`` list: ``--hosts h1:4,h2:4``, an MPI hostfile
(MPICH ``host:4``, Open MPI ``host slots=4`` or plain ``host`` lines) and a
``cluster.yaml`` with per-node settings over global defaults. Every check happens
here, with the file, line or key in the message, so that a bad entry is reported
before anything is launched and nothing from a node list can become an ssh option.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

from .._errors import InvalidArgument

__all__ = ["Node", "parse_hosts", "parse_hostfile", "load_cluster", "assign_ranks", "check_host", "check_user"]

# Host names, IPv4 and IPv6 addresses (with a %zone): nothing a shell, ssh or rsync
# could read as an option, a second word, a user@ or a path.
_HOST_RE = re.compile(r"[A-Za-z0-9_.:%]([A-Za-z0-9_.:%-]*)")
_USER_RE = re.compile(r"[A-Za-z0-9_.][A-Za-z0-9_.$-]*")
_ENV_KEY_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass
class Node:
    """One host of the job and how to reach and prepare it."""

    host: str
    user: str | None = None
    port: int | None = None
    slots: int = 1
    workdir: str | None = None  # None: sync chooses a default under the remote home
    platform: str | None = None  # None: the cpu plugin
    env: dict = field(default_factory=dict)
    path_prepend: list = field(default_factory=list)
    ld_library_path_prepend: list = field(default_factory=list)
    python: str | None = None  # None: "python3" on the node; set by build()
    ssh_options: list = field(default_factory=list)

    @property
    def label(self) -> str:
        """How reports name the node: the host, with the port when one is set."""
        return self.host if self.port is None else f"{self.host}:{self.port}"


def check_host(host, argument: str = "host", where: str = "") -> str:
    if not isinstance(host, str) or not _HOST_RE.fullmatch(host):
        raise InvalidArgument(
            f"{where}invalid host name {host!r}: only letters, digits and . _ : % - are allowed, "
            "and it must not start with '-'",
            op="run",
            argument=argument,
        )
    return host


def check_user(user, argument: str = "user", where: str = "") -> str:
    if not isinstance(user, str) or not _USER_RE.fullmatch(user):
        raise InvalidArgument(
            f"{where}invalid user name {user!r}: only letters, digits and . _ $ - are allowed, "
            "and it must not start with '-'",
            op="run",
            argument=argument,
        )
    return user


def _positive_int(value, what: str, argument: str, where: str) -> int:
    # bool is an int: "slots: true" is a mistake, not 1
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise InvalidArgument(f"{where}{what} must be a positive integer, got {value!r}", op="run", argument=argument)
    return value


def _split_user_host(text: str, argument: str, where: str) -> tuple[str | None, str]:
    user = None
    if "@" in text:
        user, text = text.rsplit("@", 1)
        check_user(user, argument, where)
    return user, text


def parse_hosts(spec: str, *, argument: str = "--hosts") -> list[Node]:
    """``"h1:4,user@h2:4,h3,[fe80::1]:2"`` -> nodes; slots default to 1."""
    if not isinstance(spec, str) or not spec.strip():
        raise InvalidArgument("empty host list", op="run", argument=argument)
    nodes = []
    for i, item in enumerate(spec.split(",")):
        where = f"entry {i + 1} ({item.strip()!r}): "
        item = item.strip()
        if not item:
            raise InvalidArgument(f"{where}empty entry", op="run", argument=argument)
        user, rest = _split_user_host(item, argument, where)
        host, slots = _host_and_slots(rest, argument, where)
        nodes.append(Node(host=host, user=user, slots=slots))
    _check_unique(nodes, argument, "")
    return nodes


def _host_and_slots(text: str, argument: str, where: str) -> tuple[str, int]:
    # an IPv6 address needs brackets before a ":slots"; a bare one has no slots
    slots = 1
    if text.startswith("["):
        end = text.find("]")
        if end < 0:
            raise InvalidArgument(f"{where}missing ']'", op="run", argument=argument)
        host, rest = text[1:end], text[end + 1 :]
        if rest:
            if not rest.startswith(":"):
                raise InvalidArgument(f"{where}expected ':slots' after ']'", op="run", argument=argument)
            slots = _positive_int(rest[1:], "slots", argument, where)
    elif text.count(":") == 1:
        host, count = text.split(":")
        slots = _positive_int(count, "slots", argument, where)
    elif ":" in text and not _looks_ipv6(text):
        raise InvalidArgument(
            f"{where}unsupported entry {text!r}: expected host or host:slots "
            "(MPICH's extra ':' fields are not supported)",
            op="run",
            argument=argument,
        )
    else:
        host = text
    return check_host(host, argument, where), slots


def _check_unique(nodes: list[Node], argument: str, where: str) -> None:
    # one node entry per (host, port): two entries would start two agents whose local
    # ranks collide on one machine; give the total slots once instead
    seen = {}
    for i, node in enumerate(nodes):
        key = (node.host, node.port)
        if key in seen:
            raise InvalidArgument(
                f"{where}node {node.label!r} is listed twice (entries {seen[key] + 1} and "
                f"{i + 1}); list it once with its total slots",
                op="run",
                argument=argument,
            )
        seen[key] = i


_OMPI_KEYS = {"slots", "max_slots", "max-slots"}


def parse_hostfile(path, *, argument: str = "--hostfile") -> list[Node]:
    """An MPICH (``host:4``), Open MPI (``host slots=4 [max_slots=8]``) or plain
    (``host``) hostfile; ``#`` starts a comment. MPICH's ``host:4:ifname`` extras
    are not supported and reported."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError as e:
        raise InvalidArgument(f"cannot read hostfile {path}: {e.strerror or e}", op="run", argument=argument) from None
    nodes = []
    for lineno, raw in enumerate(lines, 1):
        text = raw.split("#", 1)[0].strip()
        if not text:
            continue
        where = f"{path}:{lineno}: "
        words = text.split()
        user, first = _split_user_host(words[0], argument, where)
        host, slots = _host_and_slots(first, argument, where)
        for word in words[1:]:
            key, sep, value = word.partition("=")
            if not sep or key not in _OMPI_KEYS:
                raise InvalidArgument(f"{where}unknown field {word!r} (expected slots=N)", op="run", argument=argument)
            if key == "slots":
                slots = _positive_int(value, "slots", argument, where)
            else:
                _positive_int(value, key, argument, where)  # checked, not used: no cap
        nodes.append(Node(host=host, user=user, slots=slots))
    if not nodes:
        raise InvalidArgument(f"{path}: no hosts in the hostfile", op="run", argument=argument)
    _check_unique(nodes, argument, f"{path}: ")
    return nodes


def _looks_ipv6(text: str) -> bool:
    # a bare IPv6 address (at least two ':' and only hex digits, ':' and a %zone)
    return text.count(":") >= 2 and re.fullmatch(r"[0-9A-Fa-f:.]+(%[A-Za-z0-9_.-]+)?", text) is not None


# cluster.yaml -------------------------------------------------------------------------

_DEFAULT_KEYS = {
    "user",
    "port",
    "workdir",
    "python",
    "platform",
    "env",
    "path_prepend",
    "ld_library_path_prepend",
    "ssh_options",
    "slots",
}
_NODE_KEYS = _DEFAULT_KEYS | {"host"}


def load_cluster(path, *, argument: str = "--cluster") -> list[Node]:
    """Nodes of a ``cluster.yaml``::

        defaults: {user: ..., port: 22, workdir: ..., python: ..., platform: cpu,
                   env: {K: V}, path_prepend: [...], ld_library_path_prepend: [...],
                   ssh_options: [...], slots: 1}
        nodes:
          - host: h1
            slots: 4
          - {host: h2, platform: metax, env: {K: V2}}

    A node's scalar keys replace the defaults; its ``env`` is merged over the
    defaults' env; its lists replace the defaults' lists.
    """
    import yaml  # only the cluster file needs PyYAML

    try:
        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f)
    except OSError as e:
        raise InvalidArgument(
            f"cannot read cluster file {path}: {e.strerror or e}", op="run", argument=argument
        ) from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f":{mark.line + 1}" if mark is not None else ""
        raise InvalidArgument(
            f"{path}{at}: not valid YAML: {getattr(e, 'problem', e)}", op="run", argument=argument
        ) from None
    if not isinstance(data, dict):
        raise InvalidArgument(f"{path}: expected a mapping with 'nodes:'", op="run", argument=argument)
    unknown = set(data) - {"defaults", "nodes"}
    if unknown:
        raise InvalidArgument(
            f"{path}: unknown top-level key(s) {sorted(map(str, unknown))} (expected 'defaults' and 'nodes')",
            op="run",
            argument=argument,
        )
    defaults = data.get("defaults") or {}
    if not isinstance(defaults, dict):
        raise InvalidArgument(f"{path}: 'defaults' must be a mapping", op="run", argument=argument)
    base = _node_settings(defaults, _DEFAULT_KEYS, f"{path}: defaults: ", argument)
    entries = data.get("nodes")
    if not isinstance(entries, list) or not entries:
        raise InvalidArgument(f"{path}: 'nodes' must be a non-empty list", op="run", argument=argument)
    nodes = []
    for i, entry in enumerate(entries):
        where = f"{path}: nodes[{i}]: "
        if isinstance(entry, str):  # "- h1" is a node with the defaults
            entry = {"host": entry}
        if not isinstance(entry, dict) or "host" not in entry:
            raise InvalidArgument(f"{where}each node needs a 'host' key", op="run", argument=argument)
        own = _node_settings(entry, _NODE_KEYS, where, argument)
        merged = {**_copy(base), **own}
        merged["env"] = {**base.get("env", {}), **own.get("env", {})}
        nodes.append(Node(**merged))
    _check_unique(nodes, argument, f"{path}: ")
    return nodes


def _copy(settings: dict) -> dict:
    return {k: (list(v) if isinstance(v, list) else dict(v) if isinstance(v, dict) else v) for k, v in settings.items()}


def _node_settings(entry: dict, allowed: set, where: str, argument: str) -> dict:
    unknown = set(entry) - allowed
    if unknown:
        raise InvalidArgument(
            f"{where}unknown key(s) {sorted(map(str, unknown))}; known: {sorted(allowed)}", op="run", argument=argument
        )
    out = {}
    for key, value in entry.items():
        at = f"{where}{key}: "
        if value is None:
            continue
        if key == "host":
            if not isinstance(value, str):
                raise InvalidArgument(f"{at}must be a string", op="run", argument=argument)
            user, host = _split_user_host(value, argument, at)
            out["host"] = check_host(host, argument, at)
            if user is not None:
                out.setdefault("user", user)
        elif key == "user":
            out["user"] = check_user(str(value) if isinstance(value, int) else value, argument, at)
        elif key == "port":
            out["port"] = _positive_int(value, "port", argument, at)
            if out["port"] > 65535:
                raise InvalidArgument(f"{at}port out of range", op="run", argument=argument)
        elif key == "slots":
            out["slots"] = _positive_int(value, "slots", argument, at)
        elif key in ("workdir", "python", "platform"):
            if not isinstance(value, str) or not value or "\0" in value:
                raise InvalidArgument(f"{at}must be a non-empty string", op="run", argument=argument)
            if key == "platform" and not re.fullmatch(r"[A-Za-z0-9_.-]+", value):
                raise InvalidArgument(f"{at}invalid platform name {value!r}", op="run", argument=argument)
            out[key] = value
        elif key == "env":
            out["env"] = _env(value, at, argument)
        else:  # path_prepend, ld_library_path_prepend, ssh_options
            if isinstance(value, str):
                value = [value]
            if not isinstance(value, list) or not all(
                isinstance(v, (str, int)) and not isinstance(v, bool) for v in value
            ):
                raise InvalidArgument(f"{at}must be a list of strings", op="run", argument=argument)
            value = [str(v) for v in value]
            if any(not v or "\0" in v for v in value):
                raise InvalidArgument(f"{at}empty entry", op="run", argument=argument)
            out[key] = value
    # "user@host" in host and a user key at once would be ambiguous
    if "user" in entry and isinstance(entry.get("host"), str) and "@" in entry["host"]:
        raise InvalidArgument(
            f"{where}give the user either in 'host' or in 'user', not both", op="run", argument=argument
        )
    return out


def _env(value, where: str, argument: str) -> dict:
    if not isinstance(value, dict):
        raise InvalidArgument(f"{where}must be a mapping of NAME: value", op="run", argument=argument)
    env = {}
    for k, v in value.items():
        if not isinstance(k, str) or not _ENV_KEY_RE.fullmatch(k):
            raise InvalidArgument(f"{where}invalid variable name {k!r}", op="run", argument=argument)
        if isinstance(v, bool):  # YAML's yes/true: say what would be exported
            v = "1" if v else "0"
        if not isinstance(v, (str, int, float)):
            raise InvalidArgument(f"{where}{k}: value must be a string or number", op="run", argument=argument)
        v = str(v)
        if "\0" in v:
            raise InvalidArgument(f"{where}{k}: value contains a NUL byte", op="run", argument=argument)
        env[k] = v
    return env


def assign_ranks(nodes: list[Node], n: int | None = None, *, oversubscribe: bool = False) -> list[list[int]]:
    """Global ranks of each node: fill the nodes in order up to their slots (block
    mapping, like mpiexec); ``n=None`` uses every slot. More ranks than slots is an
    error unless ``oversubscribe``, which deals the extra ranks round-robin (one more
    per node in turn; each node's ranks stay consecutive)."""
    if not nodes:
        raise InvalidArgument("no nodes", op="run", argument="--hosts")
    total = sum(node.slots for node in nodes)
    if n is None:
        n = total
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise InvalidArgument(f"the number of ranks must be a positive integer, got {n!r}", op="run", argument="-n")
    if n > total and not oversubscribe:
        raise InvalidArgument(
            f"{n} ranks requested but the {len(nodes)} node(s) have {total} slot(s) in all; "
            "pass --oversubscribe to place more ranks than slots",
            op="run",
            argument="-n",
        )
    counts = [0] * len(nodes)
    left = n
    for i, node in enumerate(nodes):
        counts[i] = min(node.slots, left)
        left -= counts[i]
    for i in range(left):  # oversubscribed: one more each, in turn
        counts[i % len(nodes)] += 1
    ranks, start = [], 0
    for c in counts:
        ranks.append(list(range(start, start + c)))
        start += c
    return ranks


def default_workdir(src_dir) -> str:
    """Where ``sync`` puts a project on a node without a workdir: relative to the
    remote home (ssh starts there), named after the local folder."""
    name = os.path.basename(os.path.abspath(src_dir)) or "project"
    return f".uniccl/{name}"
