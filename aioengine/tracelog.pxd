# Declarations for the optional compiled core (setup.py): Cython compiles tracelog.py with
# these types, so that the core's push, start and finish (scheduler.pxd, bulk.pxd,
# corestate.pxd) record into a running trace with C calls, reading the operation's fields as
# C struct members, and time and thread come from C, not from Python calls.
cimport cython
from cpython.time cimport perf_counter_ns

from cpython.long cimport PyLong_FromVoidPtr

from .lock cimport thread_ident as _thread_ident
from .operation cimport _OperationCore
from .var cimport Var as _VarType


# time.perf_counter_ns()'s clock (the builder compares these times with the Python ones of
# SteppedCoroutine and ran_on), as a C call.
cdef inline object _clock():
    return perf_counter_ns()


# id(v), as a C call.
cdef inline object _key(object v):
    return PyLong_FromVoidPtr(<void *> v)


cdef bint COMPILED


@cython.final
cdef class TraceLog:
    cdef public object first
    cdef public object t0
    cdef public list pushes
    cdef public list starts
    cdef public list finishes
    cdef public dict threads
    cdef public dict steps
    cdef public dict ran
    cdef public bint stopped

    @cython.locals(op=_OperationCore, pushes=list)
    cpdef pushed(self, op)
    @cython.locals(op=_OperationCore)
    cpdef started(self, op)
    @cython.locals(op=_OperationCore, f=list, vars_=tuple, v=_VarType)
    cpdef finished(self, op)
