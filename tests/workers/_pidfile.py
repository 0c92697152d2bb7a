"""A worker's pid file for the test that signals or inspects it."""

from __future__ import annotations

import os


def write_pid(path: str) -> None:
    """Write this process's pid to ``path``, whole: written aside and renamed, as the tests read
    the file as soon as its name exists."""
    with open(path + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.replace(path + ".tmp", path)
