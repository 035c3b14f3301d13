# Declarations for the optional compiled core (setup.py): Cython compiles lock.py with these
# types, so that the scheduler's hot paths keep the lock's holder and its held-back list as C
# fields (two stores and a test per critical section) instead of attribute lookups.

cdef class EngineLock:
    cdef object __weakref__
    cdef public list after
    cdef public object give
    cdef public unsigned long owner
    cdef public object take
    cdef public object _token
