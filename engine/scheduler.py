"""Continuous batching with chunked prefill and KV admission control.

Each step packs every running decode (one token each) with at most ``chunk_size`` prefill tokens, taken
first from the sequence whose prompt is part-way through prefill, then from the waiting queue in arrival
order. Admission is head-of-line within each admission class (``Sequence.admission_class``: a large request
is never overtaken forever by its own class), but a class whose head must wait (its running limit in
``class_limits`` reached, or too little free KV for it) does not hold back the other classes: a burst of
90-minute recordings (class ``long``, limited to a few running) cannot take the rows and KV the short clips
need, and short clips keep being admitted while a long one waits for KV. The long one is not starved
either: the short class's KV is bounded by its own running count, so freed KV accumulates for it. A
sequence is admitted only when a
``req_to_token`` row is free and the free KV slots cover its whole reservation (prompt + output budget).
The reservation is allocated and written into the sequence's row at admission, in one piece: a running
sequence never runs out of KV, nothing is preempted, a request that does not fit simply waits, and a
step never allocates or writes the table (at 64 decodes a step, per-step allocation was ~0.7 ms of host
time per step on the H200, ``benchmarks/results/archive/diag_wshort_h200_f8e3287.json``).
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

import torch

from engine.kv import ReqToTokenTable, SlotAllocator
from engine.request import FinishReason, RequestRejected, Sequence, Status, stop_reason


@dataclass
class ScheduledBatch:
    """What one step runs: ``items`` are ``(sequence, num_new_tokens)``; ``admitted`` joined this step."""

    items: list[tuple[Sequence, int]] = field(default_factory=list)
    admitted: list[Sequence] = field(default_factory=list)

    @property
    def num_prefill_tokens(self) -> int:
        return sum(n for s, n in self.items if not s.prefill_done)


class Scheduler:
    """Owns the waiting queue, the running set, the slot allocator and the ``req_to_token`` table."""

    def __init__(self, allocator: SlotAllocator, table: ReqToTokenTable, max_context: int,
                 chunk_size: int = 4096, max_running: int | None = None,
                 class_limits: dict[str, int] | None = None) -> None:
        self.allocator = allocator
        self.table = table
        self.max_context = max_context
        self.chunk_size = chunk_size
        self.max_running = max_running or table.max_reqs
        self.class_limits = dict(class_limits or {})
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.running_by_class: dict[str, int] = {}

    # -- admission ---------------------------------------------------------------------------------
    def kv_needed(self, seq: Sequence) -> int:
        """KV slots the sequence reserves: prompt + output budget (tokens)."""
        return seq.prompt_len + seq.max_new_tokens

    def validate(self, seq: Sequence) -> None:
        """Clamp the budget to the context left and refuse sequences that can never run.

        Raises:
            RequestRejected: ``too_short`` for an empty prompt (the first output token is sampled at the
                prompt's last position, so there must be one); ``too_long`` when the prompt plus one output
                token exceeds the context; ``kv_capacity`` when the reservation exceeds the whole KV pool.
        """
        if seq.prompt_len == 0:
            raise RequestRejected("too_short", "the prompt has no tokens (at least one is needed)")
        if seq.prompt_len + 1 > self.max_context:
            raise RequestRejected(
                "too_long", f"prompt of {seq.prompt_len} tokens does not fit the context of {self.max_context}")
        seq.max_new_tokens = max(1, min(seq.max_new_tokens, self.max_context - seq.prompt_len))
        need = self.kv_needed(seq)
        if need > self.allocator.num_slots:
            raise RequestRejected(
                "kv_capacity",
                f"request needs {need} KV tokens (prompt {seq.prompt_len} + output {seq.max_new_tokens}); "
                f"the KV cache holds {self.allocator.num_slots}")

    def add(self, seq: Sequence) -> None:
        """Queue a sequence (validated first; see :meth:`validate`)."""
        self.validate(seq)
        seq.status = Status.WAITING
        self.waiting.append(seq)

    def _rows_left(self) -> bool:
        return self.table.num_free > 0 and len(self.running) < self.max_running

    def _class_fits(self, seq: Sequence) -> bool:
        limit = self.class_limits.get(seq.admission_class)
        if limit is not None and self.running_by_class.get(seq.admission_class, 0) >= limit:
            return False
        return self.allocator.num_free >= self.kv_needed(seq)

    def _admit(self, seq: Sequence) -> None:
        seq.row = self.table.alloc()
        seq.reserved = self.kv_needed(seq)
        slots = self.allocator.alloc(seq.reserved)
        self.table.write(seq.row, 0, slots)
        seq.kv_slots = slots.numpy()
        seq.status = Status.RUNNING
        seq.timings.admitted = time.perf_counter()
        self.running.append(seq)
        self.running_by_class[seq.admission_class] = self.running_by_class.get(seq.admission_class, 0) + 1

    # -- one step ----------------------------------------------------------------------------------
    def schedule(self) -> ScheduledBatch | None:
        """Pick this step's work and allocate its KV slots. ``None`` when there is nothing to run."""
        batch = ScheduledBatch()
        budget = self.chunk_size
        for seq in self.running:
            if seq.prefill_done:
                batch.items.append((seq, 1))
        for seq in self.running:  # a prompt part-way through prefill continues first
            if not seq.prefill_done and budget > 0:
                n = min(budget, seq.prompt_len - seq.num_computed)
                batch.items.append((seq, n))
                budget -= n
        if budget > 0 and self.waiting and self._rows_left():
            budget = self._admit_waiting(batch, budget)
        return batch if batch.items else None

    def _admit_waiting(self, batch: ScheduledBatch, budget: int) -> int:
        """Admit waiting sequences in arrival order while rows and ``budget`` (tokens) last, skipping
        every later member of a class whose head had to wait. Returns the budget left."""
        blocked: set[str] = set()
        kept: deque[Sequence] = deque()
        while self.waiting:
            seq = self.waiting.popleft()
            if budget <= 0 or not self._rows_left():
                kept.append(seq)
                kept.extend(self.waiting)
                self.waiting.clear()
                break
            if seq.admission_class in blocked or not self._class_fits(seq):
                blocked.add(seq.admission_class)
                kept.append(seq)
                continue
            self._admit(seq)
            batch.admitted.append(seq)
            n = min(budget, seq.prompt_len)
            batch.items.append((seq, n))
            budget -= n
        self.waiting = kept
        return budget

    def finish(self, seq: Sequence, reason: FinishReason) -> None:
        """End a sequence and return its KV slots and row at once."""
        if seq.finished:
            return
        seq.finish_reason = reason
        seq.status = Status.FINISHED
        seq.timings.finished = time.perf_counter()
        if seq in self.running:
            self.running.remove(seq)
            self.running_by_class[seq.admission_class] -= 1
        # membership first: a failed deque.remove formats repr(seq) into its error, ~4 ms for a sequence
        # with many slot tensors (measured on the H200), once per finished request
        if seq in self.waiting:
            self.waiting.remove(seq)
        self._release(seq)

    def _release(self, seq: Sequence) -> None:
        if seq.row is not None:
            if seq.kv_slots is not None:
                self.allocator.free(torch.from_numpy(seq.kv_slots))
            self.table.free(seq.row)
            seq.row = None
            seq.kv_slots = None

    def commit(self, batch: ScheduledBatch, next_tokens: list[int | None]) -> list[Sequence]:
        """Advance sequences after a forward: mark computed tokens, append sampled tokens, apply stops.

        ``next_tokens[i]`` is the token sampled for ``batch.items[i]`` (``None`` for a prefill chunk that
        did not reach the prompt's end). Returns the sequences that finished in this step.
        """
        done: list[Sequence] = []
        for (seq, n), tok in zip(batch.items, next_tokens, strict=True):
            if seq.finished:
                continue  # aborted while the step ran; its slots are already free
            seq.num_computed += n
            if tok is None:
                continue
            seq.output_ids.append(tok)
            reason = stop_reason(seq, tok)
            if reason is not None:
                self.finish(seq, reason)
                done.append(seq)
        return done

    def has_work(self) -> bool:
        return bool(self.running or self.waiting)
