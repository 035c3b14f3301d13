"""The grant rule with groups (read, commute, concurrent; a write is a group of one), as plain
data: no loop, no threads. A small driver pushes operations on several Vars, finishes and
cancels them with the functions the engine calls (var.py), and records which became ready."""

from __future__ import annotations

import pytest

from aioengine.operation import OpState, _OperationCore
from aioengine.var import (
    COMMUTE,
    CONCURRENT,
    READ,
    WRITE,
    Var,
    append_all,
    append_modes,
    release_all,
    release_modes,
    take_tokens,
    withdraw_all,
)


class FakeOp(_OperationCore):
    """An operation's fields without the rest of an operation (the layout a Var expects)."""

    __slots__ = ()

    def __init__(self, name: str, seq: int) -> None:
        self.name = name
        self.seq = seq
        self.nwait = 0
        self._state = OpState.PENDING
        self.vars = ()
        self.nreads = 0
        self.modes = None

    def __repr__(self) -> str:
        return f"FakeOp({self.name!r})"


class Program:
    """Drives Vars as the engine's push, finish and cancel do; ``ready`` lists the operations
    that became ready (dispatched), in order."""

    def __init__(self, *names: str) -> None:
        self.vars = {n: Var(None, n) for n in names}
        self.ready: list[str] = []
        self.ops: dict[str, FakeOp] = {}
        self.seq = 0

    def push(self, name: str, **modes: str) -> FakeOp:
        """``push("a", x="commute", y="read")``: the Vars named with their modes."""
        self.seq += 1
        op = self.ops[name] = FakeOp(name, self.seq)
        by_mode = {"read": READ, "write": WRITE, "commute": COMMUTE, "concurrent": CONCURRENT}
        reads = tuple(self.vars[v] for v, m in modes.items() if m == "read")
        others = [(self.vars[v], by_mode[m]) for v, m in modes.items() if m != "read"]
        others.sort(key=lambda p: p[1])
        op.vars = reads + tuple(v for v, _ in others)
        op.nreads = len(reads)
        if all(m == WRITE for _, m in others):
            op.nwait = append_all(op, reads, tuple(v for v, _ in others))
            if not op.nwait:
                self.ready.append(name)
        else:
            op.modes = tuple(m for _, m in others)
            op.nwait = append_modes(op, reads, op.vars[len(reads) :], op.modes)
            if not op.nwait and take_tokens(op):
                self.ready.append(name)
        self.check()
        return op

    def finish(self, name: str) -> None:
        op = self.ops[name]
        assert name in self.ready, f"{name} finishes before it was ready"
        out: list[FakeOp] = []
        op._state = OpState.DONE
        if op.modes is None:
            release_all(op.vars, op.nreads, out, True)
        else:
            release_modes(op, out, True)
        self.ready.extend(o.name for o in out)
        self.check()

    def cancel(self, name: str) -> None:
        op = self.ops[name]
        assert name not in self.ready
        op._state = OpState.CANCELLED
        out: list[FakeOp] = []
        if op.nwait:
            withdraw_all(op, out, False)
        else:
            release_all(op.vars, op.nreads, out, False)
        self.ready.extend(o.name for o in out)
        self.check()

    def check(self) -> None:
        for v in self.vars.values():
            v._check_invariants()


class TestGroups:
    def test_commute_group_waits_for_the_write_before_it(self) -> None:
        p = Program("x")
        p.push("w", x="write")
        for c in ("c1", "c2", "c3"):
            p.push(c, x="commute")
        assert p.ready == ["w"]
        p.finish("w")
        assert p.ready == ["w", "c1"]  # admitted all, one holds the token

    def test_commute_members_run_one_at_a_time_and_a_read_waits_for_all(self) -> None:
        p = Program("x")
        for c in ("c1", "c2", "c3"):
            p.push(c, x="commute")
        p.push("r", x="read")
        assert p.ready == ["c1"]
        assert p.vars["x"].statistics().mode == "commute"
        p.finish("c1")
        assert p.ready == ["c1", "c2"]
        p.finish("c2")
        p.finish("c3")
        assert p.ready == ["c1", "c2", "c3", "r"]
        assert p.vars["x"].version == 3

    def test_member_waiting_on_another_var_does_not_block_the_others(self) -> None:
        p = Program("x", "y")
        p.push("wy", y="write")
        p.push("c1", x="commute", y="read")  # waits for wy
        p.push("c2", x="commute")
        assert p.ready == ["wy", "c2"]  # c2 overtakes c1: any order within the group
        p.finish("wy")
        assert p.ready == ["wy", "c2"]  # c1's input is ready, but c2 holds x's token
        p.finish("c2")
        assert p.ready == ["wy", "c2", "c1"]

    def test_arriving_commute_joins_a_running_group(self) -> None:
        p = Program("x")
        p.push("c1", x="commute")
        p.push("c2", x="commute")
        assert p.vars["x"].statistics().pending_reads == 2
        p.finish("c1")
        assert p.ready == ["c1", "c2"]

    def test_concurrent_members_run_together_and_apart_from_reads(self) -> None:
        p = Program("x")
        p.push("k1", x="concurrent")
        p.push("k2", x="concurrent")
        p.push("r1", x="read")
        p.push("k3", x="concurrent")
        assert p.ready == ["k1", "k2"]
        p.finish("k1")
        p.finish("k2")
        assert p.ready == ["k1", "k2", "r1"]
        p.finish("r1")
        assert p.ready == ["k1", "k2", "r1", "k3"]

    def test_groups_of_different_modes_follow_push_order(self) -> None:
        p = Program("x")
        p.push("r1", x="read")
        p.push("c1", x="commute")
        p.push("k1", x="concurrent")
        p.push("w1", x="write")
        order = []
        for name in ("r1", "c1", "k1", "w1"):
            assert p.ready[-1] == name
            order.append(name)
            p.finish(name)
        assert p.ready == order

    def test_statistics_show_held_and_waiting_modes(self) -> None:
        p = Program("x")
        p.push("k", x="concurrent")
        p.push("c", x="commute")
        p.push("w", x="write")
        p.push("r", x="read")
        stats = p.vars["x"].statistics()
        assert stats.mode == "concurrent"
        assert stats.waiting_modes == ("commute", "write", "read")


class TestTokens:
    def test_several_commute_vars_are_taken_all_at_once(self) -> None:
        p = Program("x", "y")
        p.push("a", x="commute", y="commute")
        p.push("b", y="commute", x="commute")
        p.push("c", x="commute")
        assert p.ready == ["a"]
        assert p.ops["b"].nwait == -1
        assert p.ops["c"].nwait == -1
        p.finish("a")
        # b parks without holding x, so c (x only) or b may go next, never both at once
        assert len(p.ready) == 2
        p.finish(p.ready[-1])
        assert len(p.ready) == 3
        p.finish(p.ready[-1])
        assert sorted(p.ready) == ["a", "b", "c"]

    def test_a_parked_operation_holds_no_other_token(self) -> None:
        p = Program("x", "y")
        p.push("hold_y", y="commute")
        p.push("both", x="commute", y="commute")  # parks on y's token
        p.push("only_x", x="commute")
        # both is parked without x's token, so only_x runs now: no hostage
        assert p.ready == ["hold_y", "only_x"]
        p.finish("only_x")
        assert p.ready == ["hold_y", "only_x"]
        p.finish("hold_y")
        assert p.ready == ["hold_y", "only_x", "both"]

    def test_opposite_orders_never_deadlock(self) -> None:
        p = Program("x", "y")
        names = []
        for i in range(20):
            order = {"x": "commute", "y": "commute"} if i % 2 else {"y": "commute", "x": "commute"}
            p.push(f"o{i}", **order)
            names.append(f"o{i}")
        while len(p.ready) < len(names) or any(p.ops[n]._state is OpState.PENDING for n in p.ready):
            running = [n for n in p.ready if p.ops[n]._state is OpState.PENDING]
            assert len(running) == 1, running  # each holds both tokens: one at a time
            p.finish(running[0])
        assert sorted(p.ready) == sorted(names)

    @pytest.mark.parametrize("parked", [True, False])
    def test_cancelling_a_member_lets_the_group_end(self, parked: bool) -> None:
        p = Program("x", "y")
        p.push("c1", x="commute")
        if parked:
            p.push("c2", x="commute")  # admitted, parked on x's token
            assert p.ops["c2"].nwait == -1
        else:
            p.push("wy", y="write")
            p.push("c2", x="commute", y="read")  # still queued on y
        p.push("r", x="read")
        p.cancel("c2")
        assert not p.vars["x"]._contenders
        p.finish("c1")
        assert p.ready[-1] == "r"
