"""A sequence in the engine: prompt, generated tokens, KV bookkeeping, budgets, timings."""

from __future__ import annotations

import itertools
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import numpy as np
import torch

from engine.sampling import GREEDY, SamplingParams


class FinishReason(str, Enum):
    """Why a sequence ended. ``repetition`` is set by a loop guard, ``error`` by a failed step."""

    STOP = "stop"
    LENGTH = "length"
    REPETITION = "repetition"
    ABORT = "abort"
    ERROR = "error"


class Status(str, Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class RequestRejected(ValueError):
    """A sequence that can never run (empty prompt, prompt longer than the context, or larger than the
    whole KV cache).

    ``code`` is a stable machine code: ``too_short``, ``too_long`` or ``kv_capacity``; the transcriber
    adds ``unsupported_language`` (a language the loaded model does not transcribe).
    """

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


ADMISSION_CLASSES = ("default", "short", "long")
"""Values of :attr:`Sequence.admission_class`: the service's duration classes, and ``default`` for the rest."""

_ids = itertools.count(1)

LogitsProcessor = Callable[["Sequence", torch.Tensor], torch.Tensor]
StopChecker = Callable[["Sequence"], "FinishReason | None"]


@dataclass
class Timings:
    """Wall-clock marks (``time.perf_counter`` seconds) and accumulated phase durations (seconds)."""

    arrival: float = field(default_factory=time.perf_counter)
    admitted: float | None = None
    first_token: float | None = None
    finished: float | None = None
    encoder_s: float = 0.0
    prefill_s: float = 0.0
    decode_s: float = 0.0

    @property
    def queue_wait_s(self) -> float:
        return (self.admitted or self.arrival) - self.arrival


@dataclass(eq=False)
class Sequence:
    """One decoder sequence.

    Attributes:
        prompt_ids: prompt token ids (its length is the prefill length in tokens).
        max_new_tokens: output budget (tokens); clamped by the scheduler to the context left.
        stop_token_ids: EOS ids; ``ignore_eos`` disables them (benchmarks with fixed output lengths).
        mm_inputs: model-specific inputs, e.g. ``{"mel": float32 [80, 3000]}`` for a Whisper window or
            ``{"audio": float32 [n]}`` for MOSS-TD; the model's ``prepare`` turns them into cached state.
        logits_processor: optional per-step hook on this sequence's float32 ``[vocab]`` logits (host).
        sampling: :class:`engine.sampling.SamplingParams` (greedy by default; a temperature with a seed, or
            logprobs, sample this sequence on the host); ``output_logprobs`` holds one log-probability per
            output token when ``sampling.logprobs`` is set; ``generator`` is the seeded host generator.
        stop_checker: optional hook called after each token; returns a finish reason to end the sequence.
        on_event: optional callback ``(seq, kind, payload)`` for ``"started"``, ``"token"``, ``"finished"``.
            Called on the engine loop thread, unless ``inbox`` is set: then the loop thread only queues the
            event and the thread waiting in :meth:`engine.Engine.run_until_done` calls it.
        inbox: optional :class:`EventInbox` shared by a request's sequences (see there).
        done: set once the ``"finished"`` event has been emitted, after the step's accounting (timings,
            output) is complete: a waiter that sees it reads final values.
        admission_class: the scheduler's admission class (the service's duration class: ``"short"``,
            ``"long"``); classes have their own running limits (``EngineConfig.admission_limits``) and a
            sequence that must wait never holds back another class's.
        row: ``req_to_token`` row while running; ``num_computed``: tokens whose KV is cached;
        ``kv_slots``: the KV slots held, host int64 ``[reserved]`` (numpy; == the positions mapped in the
        row: the whole reservation, allocated at admission; None once released), so packing a step and
        releasing the sequence never read the device table (a device-to-host copy there would wait for
        every step in flight).
    """

    prompt_ids: list[int]
    max_new_tokens: int
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    mm_inputs: dict[str, Any] = field(default_factory=dict)
    logits_processor: LogitsProcessor | None = None
    sampling: SamplingParams = GREEDY
    stop_checker: StopChecker | None = None
    on_event: Callable[[Sequence, str, Any], None] | None = None
    inbox: EventInbox | None = None
    admission_class: str = "default"
    tag: Any = None
    id: int = field(default_factory=lambda: next(_ids))
    output_ids: list[int] = field(default_factory=list)
    status: Status = Status.WAITING
    finish_reason: FinishReason | None = None
    error: str | None = None
    row: int | None = None
    num_computed: int = 0
    kv_slots: np.ndarray | None = None
    reserved: int = 0
    mm_state: dict[str, Any] = field(default_factory=dict)
    output_logprobs: list[float] = field(default_factory=list)
    generator: torch.Generator | None = None
    timings: Timings = field(default_factory=Timings)
    done: threading.Event = field(default_factory=threading.Event, repr=False)

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_ids)

    @property
    def total_len(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def prefill_done(self) -> bool:
        return self.num_computed >= self.prompt_len

    @property
    def finished(self) -> bool:
        return self.status == Status.FINISHED

    def token_at(self, pos: int) -> int:
        """Token id at absolute position ``pos`` (prompt, then output)."""
        return self.prompt_ids[pos] if pos < self.prompt_len else self.output_ids[pos - self.prompt_len]

    def emit(self, kind: str, payload: Any = None) -> None:
        """Deliver an event (to ``inbox`` when set, else to ``on_event`` at once); ``finished`` sets ``done``."""
        if self.inbox is not None:
            self.inbox.put(self, kind, payload)
        elif self.on_event is not None:
            self.on_event(self, kind, payload)
        if kind == "finished":
            self.done.set()


class EventInbox:
    """One request's engine events, queued by the engine loop thread and delivered on the waiting thread.

    A request (say, a recording's windows) puts one inbox on each of its sequences before submitting them;
    the engine loop thread then only appends ``(seq, kind, payload)`` here, and
    :meth:`engine.Engine.run_until_done` calls each sequence's ``on_event`` from the thread that waits. So
    the request's own work (detokenising, coalescing, the service's callbacks) never runs on, nor slows, the
    thread that drives the GPU. ``batch_s`` (seconds): token events wait up to that long and are delivered
    together, so a request's thread wakes a few times a second, not at every decode step, while ``started``
    and ``finished`` wake it at once; 0 wakes it for every event. Events of one sequence keep their order.
    """

    def __init__(self, batch_s: float = 0.0) -> None:
        if batch_s < 0:
            raise ValueError(f"batch_s must be >= 0, not {batch_s}")
        self.batch_s = batch_s
        self._q: queue.SimpleQueue[tuple[Sequence, str, Any]] = queue.SimpleQueue()
        self._wake = threading.Event()

    def put(self, seq: Sequence, kind: str, payload: Any) -> None:
        """Queue one event (called by the engine loop thread; never blocks)."""
        self._q.put((seq, kind, payload))
        if kind != "token" or self.batch_s == 0:
            self._wake.set()

    def deliver(self, timeout_s: float) -> int:
        """Call ``on_event`` for every queued event, first waiting up to ``min(timeout_s, batch_s)`` seconds
        (``timeout_s`` when ``batch_s`` is 0) unless a ``started``/``finished`` event (or, with ``batch_s``
        0, any event) is already there.

        Returns the number delivered. Exceptions of a callback propagate to the caller.
        """
        wait = min(timeout_s, self.batch_s) if self.batch_s > 0 else timeout_s
        if wait > 0:
            self._wake.wait(wait)
        self._wake.clear()  # before draining: an event queued after the drain sets it again
        n = 0
        while True:
            try:
                seq, kind, payload = self._q.get_nowait()
            except queue.Empty:
                return n
            if seq.on_event is not None:
                seq.on_event(seq, kind, payload)
            n += 1


def stop_reason(seq: Sequence, token: int) -> FinishReason | None:
    """Why ``seq`` ends after ``token`` (already appended to ``output_ids``), or ``None`` to go on.

    Order: EOS (unless ``ignore_eos``), then the sequence's ``stop_checker`` (loop guard), then the budget.
    """
    if token in seq.stop_token_ids and not seq.ignore_eos:
        return FinishReason.STOP
    if seq.stop_checker is not None:
        reason = seq.stop_checker(seq)
        if reason is not None:
            return reason
    return FinishReason.LENGTH if len(seq.output_ids) >= seq.max_new_tokens else None
