# The compiled core's hide() and show(), which collector.py explains: C inline functions that
# scheduler.pxd cimports. collector.py is not compiled; the pure-Python scheduler never calls these.
from cpython.object cimport PyObject, PyTypeObject
from .operation cimport _OperationCore, Call, _show_call


cdef extern from "Python.h":
    void PyObject_GC_Track(object)
    void PyObject_GC_UnTrack(object)
    bint PyObject_GC_IsTracked(object)
    # Only the base, to recognise a direct subclass of Call in one compare.
    ctypedef struct _TypeBase "PyTypeObject":
        PyTypeObject *tp_base


cdef inline bint is_call(PyObject *fn) noexcept:
    # A borrowed pointer: no reference counting on every push's path.
    return (<_TypeBase *> fn.ob_type).tp_base == <PyTypeObject *> Call


cdef inline void hide(_OperationCore op) noexcept:
    # Untracking an untracked object is allowed: a Var tuple that another pending operation
    # hid already (the caller's, shared). The empty tuple is left alone, as show() leaves it.
    PyObject_GC_UnTrack(op)
    if op.vars:
        PyObject_GC_UnTrack(op.vars)
    PyObject_GC_UnTrack(op.snapshot)
    # A call record made for this push alone (operation.Call) and its arguments: shown again
    # when it is called (Call.show), or by show() below, or freed untracked (allowed: their
    # deallocs untrack with a check).
    cdef PyObject *fn = <PyObject *> op.fn
    if is_call(fn):
        PyObject_GC_UnTrack(<object> fn)
        args = (<Call> fn).args
        if args:
            PyObject_GC_UnTrack(args)


cdef inline void show(_OperationCore op) noexcept:
    # Tracking a tracked object is a fatal error: every check comes first. No Python code
    # runs in here, so no other thread can track them in between (the GIL is held).
    if not PyObject_GC_IsTracked(op):
        PyObject_GC_Track(op)
    # Its Var tuple may be the caller's, shown already by another operation that held it;
    # the empty tuple is never tracked.
    if op.vars and not PyObject_GC_IsTracked(op.vars):
        PyObject_GC_Track(op.vars)
    # A Context's dealloc unlinks it from the collector's lists without a check: it must be
    # tracked again before its last reference goes (collector.py).
    if not PyObject_GC_IsTracked(op.snapshot):
        PyObject_GC_Track(op.snapshot)
    cdef PyObject *fn = <PyObject *> op.fn  # None once it has finished: not a Call
    if is_call(fn):
        _show_call(<Call> fn)
