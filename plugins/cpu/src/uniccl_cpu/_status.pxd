# Turns native status codes (status.h) into uniccl's typed errors.  Inline, so
# every module that cimports it gets its own copy and no extra import.
from libc.stdint cimport int64_t


cdef extern from "status.h":
    enum:
        UC_OK
        UC_EDTYPE
        UC_EOP
        UC_EDIVISOR
        UC_ENOMEM


cdef inline int check(int status, str op, int dtype, int64_t arg) except -1:
    """Raise for a failed status; ``arg`` is the reduce op or the scale divisor."""
    if status == UC_OK:
        return 0
    from uniccl._errors import InternalError, InvalidArgument
    if status == UC_EDTYPE:
        raise InvalidArgument(f"unsupported dtype code {dtype}", op=op, argument="dtype")
    if status == UC_EOP:
        raise InvalidArgument(f"unsupported reduce op code {arg} (SUM, PROD, MAX or MIN; "
                              f"AVG is SUM followed by scale)", op=op, argument="op")
    if status == UC_EDIVISOR:
        raise InvalidArgument(f"divisor must be >= 1, got {arg}", op=op, argument="divisor")
    if status == UC_ENOMEM:
        raise InternalError("out of host memory", op=op)
    raise InternalError(f"native status {status}", op=op)
