# Declarations for the optional compiled core (setup.py): Cython compiles engine.py with these
# types. The façade is a final extension type too, so that a push reaches the scheduler's
# cpdef _push as a C call (its _core is typed), and _writes / _reads, which every push calls,
# are C methods. The Python source stays the one implementation; this file only types it.
cimport cython

from .scheduler cimport Scheduler
from .var cimport Var as _VarType


@cython.final
cdef class Engine:
    cdef dict __dict__
    cdef object __weakref__
    cdef public Scheduler _core
    cdef public object _gpu_backend
    cdef public object _settings
    cdef public object _var_count

    # Every push: its Var lists are checked and deduplicated here.
    @cython.locals(nm=Py_ssize_t, var=_VarType)
    cpdef tuple _writes(self, mutate_vars)
    @cython.locals(nc=Py_ssize_t, var=_VarType, const=tuple)
    cpdef tuple _reads(self, const_vars, tuple mutate)
