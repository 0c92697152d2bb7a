"""Hooks for frameworks (``comm.add_hook(pre=, post=, on_error=, on_abort=)``): the record each
hook gets (:class:`CallInfo`) and ready-made hooks (:func:`nan_check`).  See
:mod:`uniccl.comm.hooks` for when each runs and what it costs."""

from .comm.hooks import CallInfo, Hook, nan_check

__all__ = ["CallInfo", "Hook", "nan_check"]
