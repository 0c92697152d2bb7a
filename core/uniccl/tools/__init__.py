"""The operator's commands behind ``uniccl``'s subcommands: ``bench``, ``examples``,
``doctor``, ``report``, ``top`` and ``info``.

May import anything below it (``comm``, ``launch``, ``transport``, ``observability`` ...);
only ``cli`` and ``uniccl``'s ``__init__`` (``info``) import ``tools``.
"""
