"""Typed, picklable exceptions.

Every error carries the structured context (operation, rank, argument) as
attributes as well as in its message, and pickles with it, so an error raised
on one rank can be re-raised on another or returned from a worker process.
"""

from __future__ import annotations


class UnicclError(Exception):
    """Base of every uniccl error."""

    def __init__(
        self, message: str = "", *, op: str | None = None, rank: int | None = None, argument: str | None = None, **extra
    ):
        self.message = message
        self.op = op
        self.rank = rank
        self.argument = argument
        self.extra = extra
        for key, value in extra.items():
            setattr(self, key, value)
        super().__init__(self._render())

    def _render(self) -> str:
        where = []
        if self.op:
            where.append(self.op)
        if self.rank is not None:
            where.append(f"rank {self.rank}")
        if self.argument:
            where.append(f"argument '{self.argument}'")
        prefix = f"[{', '.join(where)}] " if where else ""
        return prefix + self.message

    def __reduce__(self):
        kwargs = dict(op=self.op, rank=self.rank, argument=self.argument, **self.extra)
        return (_rebuild, (type(self), self.message, kwargs))


def _rebuild(cls, message, kwargs):
    return cls(message, **kwargs)


class InvalidArgument(UnicclError, ValueError):
    """A buffer, dtype, op, root or peer that the operation cannot accept."""


class InvalidUsage(UnicclError, RuntimeError):
    """The API was used in a wrong state (destroyed communicator, mismatched calls...)."""


class PlatformUnavailable(UnicclError, RuntimeError):
    """No usable platform, or the one forced by UNICCL_PLATFORM cannot be used."""


class RemoteError(UnicclError, RuntimeError):
    """Another rank failed the operation; ``remote_rank`` says which, ``remote_type``
    names the exception it raised there."""


class Revoked(UnicclError, RuntimeError):
    """The communicator was revoked (``Communicator.revoke``): every call on it, in flight or
    later, on every rank, raises this; ``remote_rank`` names the rank that revoked it (maybe this
    one), the message its reason.  ``shrink()``, ``split()`` and ``destroy()`` still work."""


class Timeout(UnicclError, TimeoutError):
    """An operation did not complete in time."""


class InternalError(UnicclError, RuntimeError):
    """A transport or library failed unexpectedly (a bug or a broken system)."""


class VendorError(UnicclError, RuntimeError):
    """A vendor runtime or library returned an error status.

    ``code`` is the vendor's numeric status and ``status_name`` its symbolic name.
    """


# The public names: tracebacks print ``uniccl.RemoteError: ...`` (not ``uniccl._errors.RemoteError``),
# and pickle refers to the classes as ``uniccl.X`` (where ``uniccl`` exports them).
for _cls in (
    UnicclError,
    InvalidArgument,
    InvalidUsage,
    PlatformUnavailable,
    RemoteError,
    Revoked,
    Timeout,
    InternalError,
    VendorError,
):
    _cls.__module__ = "uniccl"
del _cls
