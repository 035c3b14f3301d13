# The compiled core's hide() and show(), which collector.py explains: C inline functions that
# scheduler.pxd cimports. collector.py is not compiled; the pure-Python scheduler never calls these.
from .operation cimport _OperationCore


cdef extern from "Python.h":
    void PyObject_GC_Track(object)
    void PyObject_GC_UnTrack(object)
    bint PyObject_GC_IsTracked(object)


# Built by the push from both a read and a write tuple (operation.py's new_operation):
# the operation's own, no caller's. (Reads or writes alone are a tuple the caller may hold.)
cdef inline bint _own_vars(_OperationCore op) noexcept:
    return 0 < op._nreads < len(op._vars)


cdef inline void hide(_OperationCore op) noexcept:
    PyObject_GC_UnTrack(op)
    if _own_vars(op):
        PyObject_GC_UnTrack(op._vars)


cdef inline void show(_OperationCore op) noexcept:
    # Tracking a tracked object is a fatal error: both checks come first. No Python code
    # runs in here, so no other thread can track them in between (the GIL is held).
    if PyObject_GC_IsTracked(op):
        return  # never hidden (a bulk segment, a wait marker), or shown already
    PyObject_GC_Track(op)
    if _own_vars(op) and not PyObject_GC_IsTracked(op._vars):
        PyObject_GC_Track(op._vars)
