# Declarations for the optional compiled core (setup.py): Cython compiles var.py with these
# types. The Python source stays the one implementation; this file only types it.
cimport cython

from .operation cimport _OperationCore


@cython.final
cdef class Var:
    cdef object __weakref__
    cdef public Py_ssize_t _dead
    cdef public object _deleted
    cdef public object _failure
    cdef public object _fences
    cdef public object _contenders
    cdef public Py_ssize_t _head
    cdef public object _owner
    cdef public list _queue
    cdef public Py_ssize_t _queued
    cdef public Py_ssize_t _reads
    cdef public bint _token
    cdef public object _value
    cdef public Py_ssize_t _version
    cdef public int _writing
    cdef public object name

    # The grant rule: a C function inlined into _append, append_all and _grant, its callers on
    # the operations' path (_check_invariants, in this module too, calls it as well).
    cdef inline bint _try_grant(self, int mode) noexcept
    # A waiter is an operation (_OperationCore): its counter and state are C struct members.
    # _grant and _release return int, not object: no None to count references to on each C
    # call (called from Python, they return 0).
    @cython.locals(op=_OperationCore, mode=int, queue=list, head=Py_ssize_t, end=Py_ssize_t)
    cpdef int _grant(self, list ready) except -1
    # append_all, and serial mode's sequencer (scheduler.py), queue every operation here: C
    # calls, not Python ones.
    @cython.locals(queued=Py_ssize_t, queue=list)
    cpdef bint _append(self, op, int write) except -1
    cpdef int _release(self, bint write, list ready, bint completed_write) except -1
    # The other modes' paths (release_modes, take_tokens): C calls too.
    cpdef int _release_member(self, list ready, bint completed) except -1
    @cython.locals(op=_OperationCore)
    cpdef int _wake_contenders(self, list ready) except -1


@cython.locals(v=Var, wait=Py_ssize_t, queue=list)
cpdef append_all(op, tuple reads, tuple writes)

@cython.locals(v=Var, i=Py_ssize_t)
cpdef release_all(tuple vars_, Py_ssize_t nreads, list ready, bint completed)

cpdef Py_ssize_t drop_consumed(list items, Py_ssize_t head) except -1

# Operations with commute or concurrent Vars (scheduler.py, Var._grant): typed, C calls.
@cython.locals(v=Var, wait=Py_ssize_t, i=Py_ssize_t)
cpdef Py_ssize_t append_modes(op, tuple reads, tuple others, tuple modes) except -1
@cython.locals(op=_OperationCore, v=Var, busy=Var, vars_=tuple, modes=tuple, n=Py_ssize_t,
               off=Py_ssize_t, i=Py_ssize_t)
cpdef bint take_tokens(op) except -1
@cython.locals(op=_OperationCore, v=Var, vars_=tuple, modes=tuple, nreads=Py_ssize_t,
               i=Py_ssize_t, mode=int)
cpdef release_modes(op, list ready, bint completed)

# Every push checks and deduplicates its Var lists (engine.py, the façade): C calls, typed.
@cython.locals(nm=Py_ssize_t, var=Var)
cpdef tuple checked_writes(owner, mutate_vars)
@cython.locals(nc=Py_ssize_t, var=Var, const=tuple)
cpdef tuple checked_reads(owner, const_vars, tuple mutate)
