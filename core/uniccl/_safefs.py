"""Files that another local user cannot redirect.

Status, trace and flight-recorder files go to directories that may be shared (``/tmp``, a
path the user set): a name planted there as a symbolic link must never make a rank write
through it (a rank may run as root), and the launcher's clean-up of old jobs must never
follow one.  So: a private directory is checked (a real directory, owned by this user,
writable by nobody else) before use and refused otherwise; files are written to a fresh
``mkstemp`` file (O_EXCL, mode 0600) and renamed over the target (a rename replaces a link,
it does not follow it); deletion walks by directory file descriptor and never follows links.
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile

from ._errors import InvalidUsage


def private_dir(path: str, what: str, op: str = "run") -> str:
    """``path`` as a directory of this user's alone: made with mode 0700 when missing, else
    checked; ``InvalidUsage`` naming it and the problem when it is a link, not a directory,
    another user's, or writable by others."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError as exc:
        raise InvalidUsage(f"cannot make the {what} {path}: {exc.strerror}", op=op, argument=what) from None
    st = os.lstat(path)
    problem = None
    if stat.S_ISLNK(st.st_mode):
        problem = f"is a symbolic link (to {os.readlink(path)})"
    elif not stat.S_ISDIR(st.st_mode):
        problem = "is not a directory"
    elif st.st_uid != os.geteuid():
        problem = f"belongs to uid {st.st_uid}, not to this user (uid {os.geteuid()})"
    elif st.st_mode & 0o022:
        problem = f"is writable by other users (mode {stat.S_IMODE(st.st_mode):o})"
    if problem is None and st.st_mode & 0o077:  # ours but readable by others (an older uniccl made it)
        os.chmod(path, 0o700)
    if problem:
        raise InvalidUsage(
            f"the {what} {path} {problem}: refusing to use it (another local user may have "
            "made it); remove it, or set TMPDIR to a directory of your own",
            op=op,
            argument=what,
        )
    return path


def write_file(path: str, data: str | bytes) -> None:
    """Write ``data`` to ``path`` atomically through a private temporary file (mode 0600)."""
    directory = os.path.dirname(path) or "."
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{os.path.basename(path)}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb" if isinstance(data, bytes) else "w") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def remove_entries(root: str, names) -> None:
    """Remove the directories ``names`` inside ``root`` (already checked private), never
    following a link: each is looked at by lstat through ``root``'s file descriptor, a link
    or a file is only unlinked, a directory removed by ``shutil.rmtree(dir_fd=...)``."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        for name in names:
            if "/" in name or name in (".", ".."):
                continue
            try:
                st = os.lstat(name, dir_fd=fd)
                if stat.S_ISDIR(st.st_mode):
                    shutil.rmtree(name, dir_fd=fd)
                else:
                    os.unlink(name, dir_fd=fd)
            except OSError:
                continue
    finally:
        os.close(fd)
