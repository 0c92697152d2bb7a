"""The shared-memory transport: ``_shm`` (Cython over core/csrc/shm_engine.c: every collective
as one GIL-free C call) and ``attach`` (which ranks share a host and the engine they attach).

May import: the base modules and ``observability.log``.
"""
