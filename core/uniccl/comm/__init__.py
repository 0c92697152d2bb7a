"""The communicator: the public object (:class:`~uniccl.comm.communicator.Communicator`), its
argument checks, the plans it builds for each collective (algorithms, ring order, staged
reduction, tuner), device routing, asynchronous work and groups, and ``uniccl.init()``
(``world``).  ``_buffer`` is the compiled per-call buffer conversion.

May import: ``transport``, ``bootstrap``, ``observability``, ``reliability``, ``kit`` and the
base modules (``_errors``, ``_types``, ``_env``, ``_plugins``, ``hookspecs``).  Nothing below
imports ``comm``.
"""
