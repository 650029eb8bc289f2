"""Admission classes: a class at its running limit or short of KV never holds back another class, and
within a class admission stays first come, first served."""

from __future__ import annotations

from engine.kv import ReqToTokenTable, SlotAllocator
from engine.request import FinishReason, Sequence
from engine.scheduler import Scheduler


def _scheduler(slots: int = 10_000, rows: int = 8, limits: dict[str, int] | None = None) -> Scheduler:
    return Scheduler(SlotAllocator(slots), ReqToTokenTable(rows, 4096, "cpu"), 4096, chunk_size=100_000,
                     class_limits=limits)


def _seq(cls: str, prompt: int = 10, out: int = 10) -> Sequence:
    return Sequence(prompt_ids=list(range(1, prompt + 1)), max_new_tokens=out, admission_class=cls)


def test_a_long_burst_leaves_rows_for_short_jobs():
    s = _scheduler(limits={"long": 2})
    longs = [_seq("long") for _ in range(6)]
    for q in longs:
        s.add(q)
    shorts = [_seq("short") for _ in range(4)]
    for q in shorts:
        s.add(q)
    batch = s.schedule()
    admitted = batch.admitted
    assert [q for q in admitted if q.admission_class == "long"] == longs[:2]  # the limit, in arrival order
    assert [q for q in admitted if q.admission_class == "short"] == shorts  # not stuck behind longs 3-6
    assert s.running_by_class == {"long": 2, "short": 4}
    assert list(s.waiting) == longs[2:]
    s.finish(longs[0], FinishReason.ABORT)
    assert s.running_by_class["long"] == 1
    assert s.schedule().admitted == [longs[2]]


def test_a_class_short_of_kv_does_not_block_another():
    s = _scheduler(slots=1_000)
    big = _seq("long", prompt=600, out=300)
    s.add(big)
    first = s.schedule()
    assert first.admitted == [big]
    waiting_long = _seq("long", prompt=500, out=100)  # 600 > the 100 slots left: waits
    s.add(waiting_long)
    small = _seq("short", prompt=20, out=20)
    later_long = _seq("long", prompt=1, out=1)  # would fit, but must not overtake its class's head
    s.add(later_long)
    s.add(small)
    batch = s.schedule()
    assert small in batch.admitted and waiting_long not in batch.admitted
    assert later_long not in batch.admitted
    assert list(s.waiting) == [waiting_long, later_long]


def test_without_limits_one_class_is_first_come_first_served():
    s = _scheduler(slots=100)
    a, b, c = _seq("default", 40, 40), _seq("default", 30, 30), _seq("default", 1, 1)
    for q in (a, b, c):
        s.add(q)
    assert s.schedule().admitted == [a]  # b does not fit; c may not overtake it
    assert list(s.waiting) == [b, c]


def test_rows_run_out_before_classes_do():
    s = _scheduler(rows=3, limits={"long": 8})
    seqs = [_seq("long") for _ in range(5)]
    for q in seqs:
        s.add(q)
    assert s.schedule().admitted == seqs[:3]
    assert list(s.waiting) == seqs[3:]
