"""The grant rule as plain data: no loop, no threads (dask's test_start_state style)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import aioengine as ae
from aioengine.operation import OpState, _OperationCore
from aioengine.var import Var, append_all, queued_behind, release_all

from .conftest import ci_examples


class FakeOp(_OperationCore):
    """Stands in for an operation: the Var touches its counter, push order and state.

    An operation's fields (_OperationCore) without the rest of an operation: the compiled
    core reads them as C struct members, so a Var's waiters must have that layout.
    """

    __slots__ = ()

    def __init__(self, name: str, seq: int, *, _wait: int = 1) -> None:
        self.name = name
        self.seq = seq
        self.nwait = _wait
        self._state = OpState.PENDING
        self.vars = ()
        self.nreads = 0
        self.modes = None

    def __repr__(self) -> str:
        return f"FakeOp({self.name!r}, {self.seq})"


@dataclass(eq=False)
class Request:
    """One pushed request of the test: its operation and mode."""

    op: FakeOp
    write: bool


class Queue:
    """Drives one Var as the engine does, recording the order of grants."""

    def __init__(self) -> None:
        self.var = Var(None, "x")
        self.granted: list[str] = []
        self.seq = 0

    def push(self, name: str, write: bool) -> Request:
        self.seq += 1
        op = FakeOp(name, self.seq)
        if self.var._append(op, write):
            op.nwait -= 1
            self.granted.append(name)
        self.var._check_invariants()
        return Request(op, write)

    def release(self, req: Request, *, completed: bool = True) -> None:
        assert self.var._holds(req.op)
        ready: list[FakeOp] = []
        self.var._release(req.write, ready, completed_write=completed)
        self.granted.extend(op.name for op in ready)
        self.var._check_invariants()

    def cancel(self, req: Request) -> None:
        assert not self.var._holds(req.op)
        req.op._state = OpState.CANCELLED
        ready: list[FakeOp] = []
        self.var._withdraw(ready)
        self.granted.extend(op.name for op in ready)
        self.var._check_invariants()


class TestGrantRule:
    def test_reads_at_the_head_are_granted_together(self) -> None:
        q = Queue()
        q.push("r1", False)
        q.push("r2", False)
        assert q.granted == ["r1", "r2"]
        assert q.var.statistics().pending_reads == 2

    def test_writer_waits_for_granted_readers(self) -> None:
        q = Queue()
        r1 = q.push("r1", False)
        r2 = q.push("r2", False)
        q.push("w1", True)
        assert q.granted == ["r1", "r2"]
        q.release(r1)
        assert q.granted == ["r1", "r2"]
        q.release(r2)
        assert q.granted == ["r1", "r2", "w1"]

    def test_reader_does_not_overtake_a_queued_writer(self) -> None:
        q = Queue()
        r1 = q.push("r1", False)
        w1 = q.push("w1", True)
        q.push("r2", False)
        assert q.granted == ["r1"]
        q.release(r1)
        assert q.granted == ["r1", "w1"]
        q.release(w1)
        assert q.granted == ["r1", "w1", "r2"]

    def test_write_releases_the_following_run_of_reads_only(self) -> None:
        q = Queue()
        w1 = q.push("w1", True)
        r1 = q.push("r1", False)
        r2 = q.push("r2", False)
        q.push("w2", True)
        q.push("r3", False)
        q.release(w1)
        assert q.granted == ["w1", "r1", "r2"]
        q.release(r2)
        q.release(r1)
        assert q.granted == ["w1", "r1", "r2", "w2"]

    def test_writes_are_granted_one_at_a_time_in_push_order(self) -> None:
        q = Queue()
        reqs = [q.push(f"w{i}", True) for i in range(4)]
        for req in reqs:
            q.release(req)
        assert q.granted == ["w0", "w1", "w2", "w3"]
        assert q.var.version == 4
        assert q.var._is_idle()

    def test_version_counts_completed_writes_only(self) -> None:
        q = Queue()
        w = q.push("w", True)
        r = q.push("r", False)
        q.release(w, completed=False)
        q.release(r)
        assert q.var.version == 0

    @pytest.mark.parametrize("position", [0, 1, 2])
    def test_cancelled_request_becomes_a_tombstone(self, position: int) -> None:
        q = Queue()
        w0 = q.push("w0", True)
        queued = [q.push("r1", False), q.push("w2", True), q.push("r3", False)]
        q.cancel(queued[position])
        q.release(w0)
        expected = {0: ["w0", "w2"], 1: ["w0", "r1", "r3"], 2: ["w0", "r1"]}[position]
        assert q.granted == expected

    def test_waiting_counts_live_requests_only(self) -> None:
        q = Queue()
        w0 = q.push("w0", True)
        queued = [q.push(f"w{i}", True) for i in range(1, 5)]
        assert q.var.statistics().waiting == 4
        q.cancel(queued[1])
        q.cancel(queued[3])
        assert q.var.statistics().waiting == 2
        assert "waiting=2>" in repr(q.var)
        q.release(w0)  # w1 granted; the tombstone w2 behind it reached the head and was dropped
        assert q.var.statistics().waiting == 1
        # w4: a tombstone, not counted
        assert [op.name for op, _ in q.var._requests()] == ["w3", "w4"]

    def test_tombstone_at_the_head_never_blocks(self) -> None:
        """Regression guard: a tombstone at the head must not hold back a later request."""
        q = Queue()
        w0 = q.push("w0", True)
        w1 = q.push("w1", True)
        q.release(w0)  # w1 granted
        w2 = q.push("w2", True)
        q.cancel(w2)
        q.release(w1)
        q.push("r", False)
        assert q.granted == ["w0", "w1", "r"]
        assert not q.var._queued
        assert not q.var._requests()

    def test_a_long_queue_drops_what_it_granted(self) -> None:
        """Writes granted one by one while more queue: push order holds, and the granted
        prefix of the queue is dropped, so its length stays bounded by what is queued."""
        q = Queue()
        reqs = [q.push(f"w{i}", True) for i in range(300)]
        for i in range(600):
            q.release(reqs[i])
            if i < 300:
                reqs.append(q.push(f"w{300 + i}", True))
            assert len(q.var._queue or ()) <= max(128, 4 * q.var._queued)
        assert q.granted == [f"w{i}" for i in range(600)]
        assert not q.var._queued
        assert q.var._is_idle()

    @pytest.mark.skipif(
        ae.engine._COMPILED,
        reason="compiled, a grant holds the GIL throughout: no other thread sees its middle",
    )
    def test_waiting_read_during_a_grant_stays_within_one(self) -> None:
        """_waiting() is read without the lock (a repr, statistics): taken between the steps
        of a grant that drops a tombstone, it never counts a request that was not queued."""
        q = Queue()
        q.push("w", True)
        q.push("r1", False)
        tomb = q.push("t", True)
        q.push("r2", False)
        q.cancel(tomb)
        assert q.var._waiting() == 2
        seen: list[int] = []

        class Spy(list[FakeOp]):
            def append(self, op: FakeOp) -> None:
                seen.append(q.var._waiting())
                super().append(op)

        q.var._release(True, Spy(), completed_write=True)
        assert seen == [1, 0]
        assert q.var._waiting() == 0

    def test_operation_waits_for_all_its_requests(self) -> None:
        x, y = Var(None, "x"), Var(None, "y")
        blocker = FakeOp("blocker", 1)
        assert x._append(blocker, True)
        op = FakeOp("op", 2, _wait=0)
        for v in (x, y):
            if not v._append(op, True):
                op.nwait += 1
        assert op.nwait == 1  # y granted at once, x queued behind the blocker
        assert y._holds(op)
        assert not x._holds(op)
        ready: list[FakeOp] = []
        x._release(True, ready, completed_write=True)
        assert ready == [op]
        assert x._holds(op)

    def test_holds_follows_push_order(self) -> None:
        """A request is held iff the queue's head was pushed after it (or nothing is queued)."""
        q = Queue()
        reqs = [q.push(name, write) for name, write in [("r1", False), ("r2", False)]]
        w = q.push("w", True)
        r3 = q.push("r3", False)
        assert [q.var._holds(r.op) for r in (*reqs, w, r3)] == [True, True, False, False]
        q.release(reqs[0])
        q.release(reqs[1])
        assert [q.var._holds(r.op) for r in (w, r3)] == [True, False]
        q.release(w)
        assert q.var._holds(r3.op)


class TestBatchForms:
    """append_all / release_all apply the per-Var methods to a whole operation: they must
    grant exactly what those grant, in the same order (nothing of the rule may be inlined
    there again)."""

    @ci_examples(200)
    @given(
        st.lists(
            st.tuples(
                st.lists(st.integers(0, 3), max_size=3, unique=True),
                st.lists(st.integers(0, 3), max_size=2, unique=True),
                st.booleans(),  # finish the oldest running operation after this push
            ),
            max_size=30,
        )
    )
    def test_batch_and_per_var_forms_grant_alike(
        self, program: list[tuple[list[int], list[int], bool]]
    ) -> None:
        batch_vars = [Var(None, f"b{i}") for i in range(4)]
        single_vars = [Var(None, f"s{i}") for i in range(4)]
        granted: dict[str, list[int]] = {"batch": [], "single": []}
        running: dict[str, list[tuple[int, FakeOp]]] = {"batch": [], "single": []}
        ops: dict[str, list[FakeOp]] = {"batch": [], "single": []}

        def ready(form: str, ops_: list[FakeOp]) -> None:
            for op in ops_:
                granted[form].append(op.seq)
                running[form].append((op.seq, op))

        for seq, (reads, writes, finish) in enumerate(program, start=1):
            reads = [r for r in reads if r not in writes]
            for form, vs in (("batch", batch_vars), ("single", single_vars)):
                op = FakeOp(f"{form}{seq}", seq, _wait=0)
                ops[form].append(op)
                const = tuple(vs[r] for r in reads)
                mutate = tuple(vs[w] for w in writes)
                if form == "batch":
                    op.nwait = append_all(op, const, mutate)
                else:
                    op.nwait = sum(not v._append(op, False) for v in const) + sum(
                        not v._append(op, True) for v in mutate
                    )
                if not op.nwait:
                    ready(form, [op])
            if finish:
                for form, vs in (("batch", batch_vars), ("single", single_vars)):
                    if not running[form]:
                        continue
                    seq_done, _ = running[form].pop(0)
                    r_done, w_done, _ = program[seq_done - 1]
                    const = tuple(vs[r] for r in r_done if r not in w_done)
                    mutate = tuple(vs[w] for w in w_done)
                    out: list[FakeOp] = []
                    if form == "batch":
                        release_all(const + mutate, len(const), out, True)
                    else:
                        for v in const:
                            v._release(False, out, True)
                        for v in mutate:
                            v._release(True, out, True)
                    ready(form, out)
            for v in (*batch_vars, *single_vars):
                v._check_invariants()
        assert granted["batch"] == granted["single"]
        assert [v.version for v in batch_vars] == [v.version for v in single_vars]


class TestQueuedBehind:
    """``queued_behind(first)`` is exactly what could never start if ``first`` never ended:
    checked against running every other operation to the end, on random queue states."""

    @settings(max_examples=300, deadline=None)
    @given(
        st.lists(
            st.tuples(
                st.lists(st.integers(0, 2), max_size=2, unique=True),
                st.lists(st.integers(0, 2), max_size=1, unique=True),
                st.sampled_from(["push", "push", "push", "finish", "cancel"]),
                st.integers(0, 29),  # which pending operation a "cancel" cancels
            ),
            min_size=1,
            max_size=30,
        ),
        st.data(),
    )
    def test_matches_running_everything_else(
        self, program: list[tuple[list[int], list[int], str, int]], data: st.DataObject
    ) -> None:
        vs = [Var(None, f"v{i}") for i in range(3)]
        running: list[FakeOp] = []
        pending: list[FakeOp] = []

        def finish(op: FakeOp, completed: bool = True) -> None:
            out: list[FakeOp] = []
            release_all(op.vars, op.nreads, out, completed)
            op._state = OpState.DONE
            running.extend(out)
            for done in out:
                pending.remove(done)

        for seq, (reads, writes, then, which) in enumerate(program, start=1):
            op = FakeOp(f"op{seq}", seq, _wait=0)
            const = tuple(vs[r] for r in reads if r not in writes)
            mutate = tuple(vs[w] for w in writes)
            op.vars = const + mutate
            op.nreads = len(const)
            op.nwait = append_all(op, const, mutate)
            (pending if op.nwait else running).append(op)
            if then == "finish" and running:
                finish(running.pop(0))
            elif then == "cancel" and pending:
                victim = pending.pop(which % len(pending))  # withdrawn as by the engine
                victim._state = OpState.CANCELLED
                out: list[FakeOp] = []
                for write, vars_ in ((False, victim.const_vars), (True, victim.mutate_vars)):
                    for v in vars_:
                        if v._holds(victim):
                            v._release(write, out, False)
                        else:
                            v._withdraw(out)
                running.extend(out)
                for ready in out:
                    pending.remove(ready)
        if not running:
            return
        first = data.draw(st.sampled_from(running))
        behind = queued_behind(first)
        assert first in behind
        target = data.draw(st.sampled_from([*running, *pending]))
        assert (target in queued_behind(first, target)) == (target in behind)  # stops early
        # Run every other operation to the end; what never starts waited for first.
        while others := [op for op in running if op is not first]:
            running.remove(others[0])
            finish(others[0])
        assert {op.name for op in behind if op is not first} == {op.name for op in pending}


class TestVarObject:
    async def test_repr_and_statistics(self, threaded_engine: ae.Engine) -> None:
        v = threaded_engine.new_var("weights")
        assert repr(v) == "<Var 'weights' version=0 reads=0 write=False waiting=0>"
        assert v.statistics() == ae.VarStatistics(
            pending_reads=0, pending_write=False, waiting=0, version=0, failed=False
        )
        await threaded_engine.push_sync(lambda rctx: None, mutate_vars=[v])
        assert v.version == 1
        assert "version=1" in repr(v)

    async def test_default_names_are_unique(self, threaded_engine: ae.Engine) -> None:
        names = {threaded_engine.new_var().name for _ in range(5)}
        assert len(names) == 5


async def test_repr_and_statistics_are_safe_while_threads_use_the_var() -> None:
    """Both read the queue without the engine lock (a repr may be taken while holding it)."""
    import threading

    async with ae.Engine(cpu_workers=2) as engine:
        x = engine.new_var("x")
        stop = threading.Event()

        def pusher() -> None:
            # Bounded: each thread pushes at most 200 rounds, whatever the machine's speed.
            for _ in range(200):
                if stop.is_set():
                    return
                for i in range(64):
                    engine.push_sync(
                        lambda r: None, ae.cpu(), [x] if i % 4 else [], [x] if i % 4 == 0 else []
                    )

        threads = [threading.Thread(target=pusher) for _ in range(2)]
        for t in threads:
            t.start()
        try:
            for _ in range(1500):
                assert "waiting=" in repr(x)
                assert x.statistics().waiting >= 0
        finally:
            stop.set()
            for t in threads:
                t.join()
        await engine.wait_for_all()
