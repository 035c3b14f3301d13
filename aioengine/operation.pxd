# Declarations for the optional compiled core (setup.py): Cython compiles operation.py with
# these types, making _OperationCore an extension type that the compiled engine reads as a C
# struct. Operation stays a Python class (it derives from Generic).
cimport cython
from cpython.object cimport PyObject


cdef extern from "Python.h":
    void PyObject_GC_Track(object)
    bint PyObject_GC_IsTracked(object)


# A function made for one push alone (operation.py): the collector's hooks (collector.pxd) hide
# it, and its args, with its operation; show() puts them back.
cdef class Call:
    cdef public tuple args
    cdef public object fn
    cdef public tuple keys
    cdef public object kwargs
    cdef public object out
    cdef public tuple positions
    cpdef show(self)


cdef inline void _show_call(Call call) noexcept:
    # Tracking a tracked object is a fatal error: each is checked first (the tuple may have
    # been untracked by the collector itself, as it does tuples of untracked items). No
    # Python code runs in here and the GIL is held, so the record's own call (Call.show) and
    # a full collection's walk on another thread (collector.pxd's show) never interleave.
    if not PyObject_GC_IsTracked(call):
        PyObject_GC_Track(call)
    args = call.args
    if args and not PyObject_GC_IsTracked(args):
        PyObject_GC_Track(args)


cdef class _OperationCore:
    cdef object __weakref__
    cdef public object callbacks
    cdef public object core
    cdef public object ctx
    cdef public object _exception
    cdef public object fn
    cdef public Py_ssize_t nfwait
    cdef public object inherited
    cdef public object key
    cdef public int kind
    cdef public object modes
    cdef public Py_ssize_t nreads
    cdef public object owner
    cdef public object priority
    cdef public object prop
    cdef public object _result
    cdef public object segment
    cdef public object seq
    cdef public object snapshot
    cdef public object _state
    cdef public object target
    cdef public object task
    cdef public tuple vars
    cdef public Py_ssize_t nwait
    cdef public object waiters
    cdef public str name


# The engine calls it as a C function on every push; its stores are C struct writes.
@cython.locals(op=_OperationCore, cls=type)
cpdef new_operation(core, owner, fn, int kind, ctx, tuple const, tuple mutate, prop, priority,
                    str name, target=*)
