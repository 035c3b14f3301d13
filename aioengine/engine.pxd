# Declarations for the optional compiled core (setup.py): Cython compiles engine.py with these
# types. The façade is a final extension type too, so that a push reaches the scheduler's
# cpdef push as a C call (its _core is typed). The Python source stays the one
# implementation; this file only types it.
cimport cython

from .functions cimport is_coroutine_code as _is_coroutine_code, qualified_name as _qualified_name
from .scheduler cimport Scheduler
# Every push checks its Var lists: C calls.
from .var cimport checked_reads, checked_writes

# The operation kinds (kinds.py), imported by engine.py, as C ints: a push passes its kind
# to the scheduler's C call without converting an object.
cdef int _BULK, _CORO, _SYNC, _WAIT


@cython.final
cdef class Engine:
    cdef dict __dict__
    cdef object __weakref__
    cdef public Scheduler _core
    cdef public object _settings
    cdef public object _var_count
