# Declarations for the optional compiled core (setup.py): Cython compiles wakeups.py with these
# types, so that the scheduler reads the waiter lists on every completion as C struct members.
cimport cython


@cython.final
cdef class Wakeups:
    cdef public list capacity
    cdef public bint capacity_due
    cdef public list idle
    cdef public bint idle_due
    cdef public list inbox
    cdef public bint scheduled
