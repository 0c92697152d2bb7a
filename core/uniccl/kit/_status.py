"""One place that turns a vendor status into a typed, picklable uniccl error."""

from __future__ import annotations

from .._errors import VendorError


def check_status(
    status: int,
    call: str,
    vendor: str,
    names: dict,
    *,
    success: int = 0,
    classes=None,
    name_of=None,
    op: str | None = None,
    rank: int | None = None,
) -> None:
    """Raise unless ``status == success``.

    ``names``: {code: symbolic name} (``name_of(code)`` asks the library itself when
    given).  ``classes``: {code: UnicclError subclass} for statuses with a meaning of
    their own (e.g. ncclRemoteError -> RemoteError); the rest raise VendorError.
    The error names the call, carries ``code``, ``status_name`` and ``call``.
    """
    if status == success:
        return
    name = None
    if name_of is not None:
        try:
            name = name_of(status)
        except Exception:  # the library's own lookup must never hide the real error
            name = None
    name = name or names.get(status) or f"unknown status {status}"
    cls = (classes or {}).get(status, VendorError)
    raise cls(
        f"{call} failed: {name} ({status}) [{vendor}]",
        op=op,
        rank=rank,
        code=int(status),
        status_name=name,
        call=call,
        vendor=vendor,
    )


def renamed(statuses: dict, old: str, new: str) -> dict:
    """A status table under another symbol prefix: vendors that kept CUDA's or NCCL's numbering
    (``renamed(CUDA_STATUS, "cuda", "musa")`` gives musaErrorNotReady for 600 …)."""
    return {code: new + name[len(old) :] if name.startswith(old) else name for code, name in statuses.items()}
