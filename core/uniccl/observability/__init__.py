"""What a job shows of itself: debug logging (``log``), telemetry counters (``telemetry``,
compiled ``_counters``), Chrome traces (``trace``), Prometheus metrics (``metrics``), status
files for ``uniccl top`` (``status``) and the flight recorder (``flight``, placed here rather
than under ``reliability``: it is read by ``status`` and writes ``trace``'s files).

May import: the base modules only (``_env``, ``_errors``, ``_types``, ``_safefs``).
"""
