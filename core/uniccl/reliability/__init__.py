"""Time limits (``timeout``: one parser and default for every call's ``timeout=``) and fault
injection (``faults``: ``UNICCL_FAULT_INJECT``, for the tests and chaos runs).

May import: the base modules only.
"""
