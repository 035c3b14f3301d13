# Declarations for the optional compiled core (setup.py): Cython compiles bulk.py with these
# types: the compiled scheduler calls the methods of Segments, its part that runs segments
# (size_for among them, which every push inside a bulk() block asks), as C functions. Segments
# takes the scheduler as a typed argument, typed by its base CoreState (corestate.pxd), which
# declares the fields and the methods used here: scheduler.pxd cimports this file, and this
# file does not cimport scheduler.pxd.
cimport cython

from .operation cimport _OperationCore, new_operation
from .corestate cimport CoreState
from .lock cimport EngineLock as _LockType
from .var cimport Var as _VarType, append_all, release_all


@cython.final
cdef class Bulk:
    cdef public bint _active
    cdef public object _core
    cdef public object _outer
    cdef public object _task
    cdef public object _token
    cdef public bint _used
    cdef public object size  # any int the pure class takes: a C size would overflow


@cython.final
cdef class Segments:
    cdef public bint flush_scheduled
    cdef public object open
    cdef public Py_ssize_t scopes

    @cython.locals(scope=Bulk)
    cpdef size_for(self, CoreState core)
    cpdef enter(self)
    cpdef exit(self, CoreState core)
    cpdef flush(self, CoreState core)
    cpdef flush_soon(self, CoreState core)
    @cython.locals(op=_OperationCore, seg=_OperationCore)
    cpdef join_locked(self, CoreState core, op, size)
    @cython.locals(seg=_OperationCore, op=_OperationCore, wait=Py_ssize_t, sequencer=_VarType,
                   vars_=tuple, k=Py_ssize_t)
    cpdef flush_locked(self, CoreState core)
    @cython.locals(seg=_OperationCore, op=_OperationCore, done=_OperationCore, i=Py_ssize_t,
                   n=Py_ssize_t, vars_=tuple, k=Py_ssize_t, v=_VarType, lock=_LockType)
    cpdef run(self, CoreState core, seg, bint more)
    @cython.locals(seg=_OperationCore, lock=_LockType)
    cpdef release(self, CoreState core, seg, bint more)
