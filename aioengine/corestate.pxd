# Declarations for the optional compiled core (setup.py): Cython compiles corestate.py with
# these types, so that the scheduler's fields are C struct members that the compiled hot path
# (scheduler.py, bulk.py) reads and writes directly. bulk.pxd types the scheduler as this
# class, and scheduler.pxd cimports bulk.pxd: neither .pxd file cimports the other's
# dependants (no cimport cycle). tests/test_pxd_fields.py checks that the fields listed here
# are the ones corestate.py assigns.
cimport cython

from .loopqueue cimport LoopQueue
from .operation cimport _OperationCore
from .var cimport Var as _VarType
from .wakeups cimport Wakeups


cdef class CoreState:
    cdef object __weakref__
    cdef public bint _deleted_vars
    cdef public dict failures
    cdef public object finished
    cdef public bint forked
    cdef public object gpu
    cdef public bint _guarded
    cdef public tuple instruments
    cdef public tuple _last_route
    cdef public object ledger
    cdef public dict live
    cdef public object lock
    cdef public unsigned long loop_thread
    cdef public object loop
    cdef public object loop_ctx
    cdef public list _loop_finished
    cdef public object _loop_is_running
    cdef public LoopQueue loop_queue
    cdef public object loop_rctx
    cdef public bint may_hold
    cdef public object _pid
    cdef public object remote
    cdef public object routes
    cdef public object segments  # a Segments: bulk.pxd types this class
    cdef public object seq
    cdef public _VarType _sequencer  # serial mode's Var, else None
    cdef public object settings
    cdef public object state
    cdef public list _wakes
    cdef public Wakeups wakeups

    # The cycle's methods that bulk.py calls as C functions; the Scheduler implements them.
    # (An argument's type is part of the signature the Scheduler's overrides repeat.)
    cpdef list dispatch_locked(self, list ready)
    @cython.locals(op=_OperationCore)
    cpdef complete_locked(self, op, state)
    @cython.locals(op=_OperationCore)
    cpdef enqueue_loop_locked(self, op)
    cpdef claim_loop_op_locked(self, list todo)
