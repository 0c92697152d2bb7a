"""uniccl's entry point in torch's "torch.backends" group, which torch calls on every
``import torch``: with ``UNICCL_TORCH_AUTOLOAD=1`` it registers the "uniccl"
torch.distributed backend (``import uniccl.torch``); otherwise it does nothing, and costs
nothing (this package is apart from ``uniccl`` so that nothing else is imported).  It never
raises: a failing entry point there would break ``import torch``."""

import os


def autoload() -> None:
    # unset or off: return before anything is imported; any other value is uniccl._env's to
    # judge (its boolean spellings; a bad one is named in the warning below)
    if os.environ.get("UNICCL_TORCH_AUTOLOAD", "").strip().lower() in ("", "0", "false", "no", "off"):
        return
    try:
        from uniccl import _env

        if not _env.flag("UNICCL_TORCH_AUTOLOAD"):
            return
        import uniccl.torch  # noqa: F401  (registers the backend)
    except Exception as exc:
        import warnings

        warnings.warn(
            f"uniccl: the torch.distributed backend was not registered: {exc!r}", RuntimeWarning, stacklevel=2
        )
