# The compiled façade's shortcuts for classifying a pushed function: C inline functions that
# engine.pxd cimports. A push of a plain function reads its code flags (is it ``async def``?)
# and its qualified name (the default operation name) from the function's C struct, where the
# Python source reads ``func.__code__.co_flags`` and ``func.__qualname__``: three attribute
# lookups per push. The callers check ``type(func) is FunctionType`` first.
from cpython.object cimport PyObject


cdef extern from "Python.h":
    ctypedef struct PyCodeObject:
        int co_flags
    enum: CO_COROUTINE
    ctypedef struct PyFunctionObject:
        PyObject *func_code
        PyObject *func_qualname


cdef inline bint is_coroutine_code(object func) noexcept:
    return (<PyCodeObject *> (<PyFunctionObject *> func).func_code).co_flags & CO_COROUTINE


cdef inline str qualified_name(object func):
    # A function's __qualname__ is always a str (its setter refuses anything else).
    return <str> (<PyFunctionObject *> func).func_qualname
