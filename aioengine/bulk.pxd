# Declarations for the optional compiled core (setup.py): Cython compiles bulk.py with these
# types, and the compiled engine calls size_for, which every push inside a bulk() block asks,
# as a C function.
cimport cython


@cython.final
cdef class Bulk:
    cdef public bint _active
    cdef public object _engine
    cdef public object _outer
    cdef public object _task
    cdef public object _token
    cdef public bint _used
    cdef public object size  # any int the pure class takes: a C size would overflow


@cython.locals(scope=Bulk)
cpdef size_for(engine)
