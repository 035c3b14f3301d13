# Declarations for the optional compiled core (setup.py): Cython compiles lock.py with these
# types, so that the scheduler's hot paths keep the lock's holder and its held-back list as C
# fields (two stores and a test per critical section) instead of attribute lookups.
from cpython.pythread cimport PyThread_get_thread_ident


# The calling thread's ident (threading.get_ident()) as a C call: the scheduler's hot paths
# compare it with the lock's owner and the loop's thread (cimported by scheduler.pxd).
cdef inline unsigned long thread_ident() noexcept:
    return <unsigned long> PyThread_get_thread_ident()


cdef class EngineLock:
    cdef object __weakref__
    cdef public list after
    cdef public object give
    cdef public unsigned long owner
    cdef public object take
    cdef public object _token

    # The hot paths' critical sections: C methods (no check for a Python override; a test's
    # stand-in lock provides its own take and give instead).
    cdef int enter(self, unsigned long me) except -1
    cdef int leave(self) except -1
