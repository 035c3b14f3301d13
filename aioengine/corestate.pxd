# Declarations for the optional compiled core (setup.py): Cython compiles corestate.py with
# these types, so that the scheduler's fields are C struct members that the compiled hot path
# (scheduler.py, bulk.py) reads and writes directly, and an operation's completion a C method.
# bulk.pxd types the scheduler as this class, and scheduler.pxd cimports bulk.pxd: no .pxd
# file cimports one that cimports it back. tests/test_pxd_fields.py checks that the fields listed here
# are the ones corestate.py assigns.
cimport cython

from .collector cimport show as _show
from .loopqueue cimport LoopQueue
from .operation cimport _OperationCore
from .tracelog cimport TraceLog
from .var cimport Var as _VarType
from .wakeups cimport Wakeups


# The operation kinds (kinds.py) as C ints, as in scheduler.pxd.
cdef int _BULK, _WAIT


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
    cdef public TraceLog tracelog
    cdef public list _wakes
    cdef public Wakeups wakeups

    # Every operation's completion (the scheduler's, and bulk.py's for each segment member).
    @cython.locals(op=_OperationCore, finished=dict, row=list, i=Py_ssize_t)
    cpdef complete_locked(self, op, state)
    @cython.locals(op=_OperationCore)
    cpdef _notify_locked(self, op)
    @cython.locals(op=_OperationCore)
    cpdef _show_live(self)
