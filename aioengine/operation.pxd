# Declarations for the optional compiled core (setup.py): Cython compiles operation.py with
# these types, making _OperationCore an extension type that the compiled engine reads as a C
# struct. Operation stays a Python class (it derives from Generic).
cimport cython


cdef class _OperationCore:
    cdef object __weakref__
    cdef public object _callbacks
    cdef public object _core
    cdef public object _ctx
    cdef public object _exception
    cdef public object _fn
    cdef public Py_ssize_t _fwait
    cdef public object _inherited
    cdef public object _key
    cdef public int _kind
    cdef public object _modes
    cdef public Py_ssize_t _nreads
    cdef public object _owner
    cdef public object _priority
    cdef public object _prop
    cdef public object _result
    cdef public object _segment
    cdef public object _seq
    cdef public object _snapshot
    cdef public object _state
    cdef public object _target
    cdef public object _task
    cdef public tuple _vars
    cdef public Py_ssize_t _wait
    cdef public object _waiters
    cdef public str name


# The engine calls it as a C function on every push; its stores are C struct writes.
@cython.locals(op=_OperationCore, cls=type)
cpdef new_operation(core, owner, fn, int kind, ctx, tuple const, tuple mutate, prop, priority,
                    str name, target=*)
