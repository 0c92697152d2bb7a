"""The communicator: the public object (:class:`~uniccl.comm.communicator.Communicator`, with
its read-only ``views``), its argument checks (``checks``), the plans it builds for each
operation (``plans``; algorithms, ring order, staged reduction, tuner and its ``costmodel``), the cross-rank
agreement on each call (``agreement``), device routing (``native``: the vendor library,
staging through ``device``, the hierarchical path), what a failed or traced call leaves
behind (``outcome``), asynchronous work and groups, and ``uniccl.init()`` (``world``).
``_buffer`` is the compiled per-call buffer conversion.

May import: ``transport``, ``bootstrap``, ``observability``, ``reliability``, ``kit`` and the
base modules (``_errors``, ``_types``, ``_env``, ``_plugins``, ``hookspecs``).  Nothing below
imports ``comm``.
"""
