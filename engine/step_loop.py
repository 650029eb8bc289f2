"""The engine's one step loop: schedule, admit, launch, complete, account.

Each :meth:`StepLoop.step` schedules a batch (:meth:`engine.scheduler.Scheduler.schedule`) and runs it in
two halves, given by a :class:`StepKind`:

- ``launch``: pack the batch and queue its forward and its sampling;
- ``complete``: read the tokens, commit them under the stop rules (EOS, stop checker, length) and emit the
  ``token`` events.

:class:`EagerSteps` completes each step at once (the synchronous loop). With async decode
(``EngineConfig.async_decode``) :class:`engine.overlap.LookaheadSteps` launches step N+1 before step N
completes, so the host's work on step N overlaps the device running step N+1; a step with a sequence
sampled on the host (:func:`engine.sampling.needs_host`) completes the step in flight first, then runs
eagerly.

Written once here, for both kinds:

- admission: the newly admitted sequences get ``started``, then ``model.prepare`` (their encoder), whose
  wall time goes to their ``timings.encoder_s``;
- timing: every sequence of a step gets the time from its launch to the end of the completion that
  iteration waited for (its own when eager, the previous step's when looking ahead), as ``decode_s`` when
  its prompt was done before the step, else ``prefill_s``; admission is not part of it;
- counting: ``counters`` (steps, prompt and sampled tokens, finished, errors) and the recent token
  rate, once per completed step;
- ``finished`` events: after the timing and counting, so a waiter woken by one reads final figures;
- failure: an exception anywhere in a step ends that step's sequences (and those of the step in flight)
  with finish reason ``error`` and the message in ``Sequence.error``; the engine goes on.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from engine.request import FinishReason, Sequence
from engine.sampling import SampledStep, attach_logprobs, needs_host, sample_step
from engine.scheduler import ScheduledBatch, Scheduler

if TYPE_CHECKING:
    from engine.kv import CrossKVPool
    from engine.models.interface import EngineModel
    from engine.runner import ModelRunner

log = logging.getLogger("diarist.engine")

RATE_WINDOW_S = 10.0
"""Seconds of completed steps that ``tokens_per_s`` and ``steps_per_s`` average over."""


@dataclass
class Completed:
    """What completing a step gave: the sequences it finished (their ``finished`` not yet emitted) and
    the number of tokens it appended."""

    done: list[Sequence]
    applied: int


class StepKind(Protocol):
    """How a step is launched and completed. ``launch`` returns what ``complete`` needs (``work``)."""

    def launch(self, batch: ScheduledBatch) -> Any:
        """Queue the forward and sampling of ``batch`` (admission already done)."""
        ...

    def complete(self, batch: ScheduledBatch, work: Any) -> Completed:
        """Read the step's tokens, commit them and emit their ``token`` events."""
        ...


class LookaheadKind(StepKind, Protocol):
    """A kind whose launched steps stay in flight while the next one launches
    (:class:`engine.overlap.LookaheadSteps`): their sequences carry placeholder output ids meanwhile."""

    def drop_aborted(self, work: Any) -> None:
        """Before scheduling: forget the in-flight tokens of sequences aborted since ``work`` launched."""
        ...

    def abandon(self, seq: Sequence) -> None:
        """After a failed step: remove ``seq``'s placeholders of tokens that will never be read."""
        ...


@dataclass
class Launched:
    """A launched step: its batch, its prompt tokens, whether each item was decoding (prompt done before
    the step: the timing's category), and the kind's ``work`` to complete it with."""

    batch: ScheduledBatch
    n_prefill: int
    decoding: list[bool]
    work: Any = None


class EagerSteps:
    """Synchronous steps: the forward's logits are sampled (:func:`engine.sampling.sample_step`) at launch,
    and completion commits the tokens (:meth:`Scheduler.commit`)."""

    def __init__(self, runner: ModelRunner, scheduler: Scheduler) -> None:
        self.runner = runner
        self.scheduler = scheduler

    def launch(self, batch: ScheduledBatch) -> SampledStep:
        """Pack ``batch``, run the forward (a CUDA graph or eager) and sample its tokens."""
        fb, sample = self.runner.build(batch)
        logits = self.runner.forward(fb)
        return sample_step(batch.items, logits, sample)

    def complete(self, batch: ScheduledBatch, work: SampledStep) -> Completed:
        """Commit the sampled tokens (stop rules), attach their log-probabilities, emit ``token`` events."""
        done = self.scheduler.commit(batch, work.tokens)
        attach_logprobs(work.logprobs)
        now = time.perf_counter()
        applied = 0
        for (seq, _), tok in zip(batch.items, work.tokens, strict=True):
            if tok is not None:
                applied += 1
                if seq.timings.first_token is None:
                    seq.timings.first_token = now
                seq.emit("token", tok)
        return Completed(done, applied)


class StepLoop:
    """Runs the engine's steps (module docstring). Not thread-safe: the engine calls :meth:`step` under its
    lock, on its step stream, after draining its inbox.

    Attributes:
        counters: ``steps`` (completed), ``prefill_tokens`` (prompt tokens computed), ``decode_tokens``
            (tokens sampled and appended), ``finished`` (sequences ended by a stop rule), ``errors``
            (failed steps).
        pending: the launched step not yet completed (async decode only), else ``None``.
    """

    def __init__(self, scheduler: Scheduler, runner: ModelRunner, model: EngineModel,
                 cross: CrossKVPool | None, lookahead: LookaheadKind | None = None) -> None:
        self.scheduler = scheduler
        self.model = model
        self.cross = cross
        self.eager = EagerSteps(runner, scheduler)
        self.lookahead = lookahead
        self.pending: Launched | None = None
        self.counters = {"steps": 0, "prefill_tokens": 0, "decode_tokens": 0, "finished": 0, "errors": 0}
        self._recent: deque[tuple[float, int]] = deque(maxlen=256)

    def step(self) -> bool:
        """Run one step. Returns False when there was nothing to do (nothing scheduled, nothing in flight)."""
        la, inflight = self.lookahead, self.pending
        if inflight is not None:
            la.drop_aborted(inflight.work)
        batch = self.scheduler.schedule()
        if batch is None and inflight is None:
            return False
        overlap = batch is not None and la is not None and not any(needs_host(s) for s, _ in batch.items)
        if not overlap and inflight is not None:  # complete the step in flight on its own first
            self.pending = None
            try:
                _emit_finished(self._complete(la, inflight))
            except Exception as exc:  # noqa: BLE001 - a failed step ends its sequences, never the engine
                self._fail([inflight.batch], exc)
            inflight = None
            if batch is not None:  # scheduled before that completion: drop what it finished
                batch.items = [(s, n) for s, n in batch.items if not s.finished]
                batch.admitted = [s for s in batch.admitted if not s.finished]
        if batch is not None and batch.items:
            try:
                self._run(batch, la if overlap else self.eager, inflight)
            except Exception as exc:  # noqa: BLE001
                self._fail([batch, inflight.batch if inflight is not None else None], exc)
        return True

    def _run(self, batch: ScheduledBatch, kind: StepKind, inflight: Launched | None) -> None:
        """Admit and launch ``batch``, then complete a step: ``batch`` itself when eager; when looking
        ahead the one in flight (if any), and ``batch`` becomes the one in flight."""
        self._admit(batch)
        step = Launched(batch, batch.num_prefill_tokens, [s.prefill_done for s, _ in batch.items])
        t0 = time.perf_counter()
        step.work = kind.launch(batch)
        if kind is self.eager:
            done = self._complete(kind, step)
        else:
            done = self._complete(kind, inflight) if inflight is not None else []
            self.pending = step
        dt = time.perf_counter() - t0
        for (seq, _), decoding in zip(batch.items, step.decoding, strict=True):
            if decoding:
                seq.timings.decode_s += dt
            else:
                seq.timings.prefill_s += dt
        _emit_finished(done)  # after the accounting: a waiter woken by it reads the final timings

    def _admit(self, batch: ScheduledBatch) -> None:
        if not batch.admitted:
            return
        t0 = time.perf_counter()
        for seq in batch.admitted:
            seq.emit("started")
        self.model.prepare(batch.admitted, self.cross)
        dt = time.perf_counter() - t0
        for seq in batch.admitted:
            seq.timings.encoder_s += dt

    def _complete(self, kind: StepKind, step: Launched) -> list[Sequence]:
        """Complete ``step`` and count it. Returns the sequences it finished (``finished`` not emitted)."""
        res = kind.complete(step.batch, step.work)
        c = self.counters
        c["steps"] += 1
        c["prefill_tokens"] += step.n_prefill
        c["decode_tokens"] += res.applied
        c["finished"] += len(res.done)
        self._recent.append((time.perf_counter(), step.n_prefill + res.applied))
        return res.done

    def _fail(self, batches: list[ScheduledBatch | None], exc: Exception) -> None:
        """End the sequences of ``batches`` (the failed step, and the one in flight) with finish reason
        ``error``; emit ``finished`` for every one not yet ended, also those a partly applied step finished
        before it failed. Nothing stays in flight."""
        log.exception("engine step failed")
        self.counters["errors"] += 1
        self.pending = None
        for seq in dict.fromkeys(s for b in batches if b is not None for s, _ in b.items):
            if self.lookahead is not None:
                self.lookahead.abandon(seq)
            if not seq.finished:
                seq.error = f"{type(exc).__name__}: {exc}"
                self.scheduler.finish(seq, FinishReason.ERROR)
            if not seq.done.is_set():
                seq.emit("finished", seq.finish_reason)

    def rates(self, now: float) -> tuple[float, float]:
        """``(tokens per second, steps per second)`` over the steps completed in the last
        :data:`RATE_WINDOW_S` seconds before ``now`` (``time.perf_counter()``); 0 with fewer than two."""
        recent = [(t, n) for t, n in self._recent if now - t <= RATE_WINDOW_S]
        span = (now - recent[0][0]) if len(recent) > 1 else 0.0
        if span <= 0:
            return 0.0, 0.0
        return sum(n for _, n in recent) / span, len(recent) / span


def _emit_finished(done: list[Sequence]) -> None:
    for seq in done:
        seq.emit("finished", seq.finish_reason)
