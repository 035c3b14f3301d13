# Declarations for the optional compiled core (setup.py): Cython compiles loopqueue.py with
# these types, and the compiled scheduler calls LoopQueue's methods, on every loop-thread
# operation's path, as C functions.
cimport cython

from .operation cimport _OperationCore
from .var cimport drop_consumed


@cython.final
cdef class LoopQueue:
    cdef public Py_ssize_t base
    cdef public list fifo
    cdef public Py_ssize_t head
    cdef public list heap
    cdef public dict heap_ops
    cdef public bint scheduled

    @cython.locals(op=_OperationCore)
    cpdef bint put_locked(self, op) except -1
    @cython.locals(op=_OperationCore, fifo=list, n=Py_ssize_t, seq=Py_ssize_t, i=Py_ssize_t,
                   gap=Py_ssize_t)
    cpdef bint _fifo_put(self, op) except -1
    @cython.locals(first=_OperationCore, op=_OperationCore, fifo=list, heap=list,
                   head=Py_ssize_t, n=Py_ssize_t, kept=Py_ssize_t)
    cpdef pop_locked(self)
    @cython.locals(op=_OperationCore, fifo=list, i=Py_ssize_t)
    cpdef bint unqueue_locked(self, op) except -1
    cpdef bint empty_locked(self) except -1
