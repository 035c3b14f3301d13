# Declarations for the optional compiled core (setup.py): Cython compiles scheduler.py with
# these types. Scheduler becomes a final extension type, derived from CoreState (whose fields
# are C struct members: corestate.pxd), and
# the methods on every operation's path take typed operations (_OperationCore). The Python
# source stays the one implementation; this file only types it (tests/test_pxd_fields.py
# checks that the two list the same fields).
cimport cython

from .bulk cimport Segments
from .corestate cimport CoreState
from .lock cimport EngineLock as _LockType, thread_ident as _thread_ident
from .loopqueue cimport LoopQueue
from .wakeups cimport Wakeups
from .collector cimport hide as _hide, show as _show
from .operation cimport _OperationCore, new_operation
# Cimported, so that the scheduler calls them as C functions, not through Python calls. The
# Var type only under another name, for typed locals: a cimported name is no module global,
# and typing.get_type_hints() on the scheduler's methods must find Var there.
from .var cimport Var as _VarType, append_all, release_all

# The operation kinds (kinds.py), imported by scheduler.py, as C ints: every test of an
# operation's kind (a C field) is then a C comparison, not a boxed int's against an object.
cdef int _BULK, _CORO, _SYNC, _WAIT


# Final, so that its methods call each other directly (it overrides none of CoreState's).
@cython.final
cdef class Scheduler(CoreState):
    # Its fields are CoreState's (corestate.pxd); the per-operation cycle's methods:

    # Every operation's path: push, queue, start, run, finish, release.
    @cython.locals(op=_OperationCore, lock=_LockType, me="unsigned long",
                   collecting="unsigned long", segments=Segments)
    cpdef push(self, owner, fn, int kind, ctx, tuple const, tuple mutate, prop, priority, name,
                deleting, handle=*, modes=*, made=*)
    @cython.locals(op=_OperationCore, wait=Py_ssize_t, sequencer=_VarType)
    # push's critical section: a C function of push only, which the C compiler inlines.
    cdef inline object _admit_locked(self, op, ctx, tuple const, tuple mutate, handle, deleting,
                                     modes, bulk, Segments segments)
    @cython.locals(op=_OperationCore)
    cpdef enqueue_loop_locked(self, op)
    @cython.locals(op=_OperationCore, budget=Py_ssize_t, lock=_LockType)
    cpdef _run_loop_queue(self)
    @cython.locals(op=_OperationCore, queue=LoopQueue)
    cpdef claim_loop_op_locked(self, list todo)
    @cython.locals(op=_OperationCore)
    cpdef bint start_locked(self, op, list todo) except -1
    @cython.locals(lock=_LockType)
    cpdef finish(self, op, state, result, exc)
    @cython.locals(op=_OperationCore, kind=int, lock=_LockType, segments=Segments)
    cpdef _execute_one(self, op, rctx, bint claimed=*, bint more=*)
    @cython.locals(op=_OperationCore, only=_OperationCore, candidate=_OperationCore,
                   queue=LoopQueue, lock=_LockType)
    cpdef _finish_and_continue(self, op, result)
    @cython.locals(op=_OperationCore)
    cpdef _done_locked(self, op, result, list ready)
    @cython.locals(op=_OperationCore, i=Py_ssize_t, queue=LoopQueue)
    cpdef list dispatch_locked(self, list ready)
