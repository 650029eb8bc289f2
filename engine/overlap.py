"""Async decode (one-step lookahead): step N+1 is launched before the host reads step N's tokens.

On by default for CUDA (``EngineConfig.async_decode``). Each loop iteration: schedule step N+1 from the optimistic state,
launch it, then wait for step N's tokens and apply them. Sampled tokens never wait on the host to feed the
next step: they are written on the device into ``next_tok[row]`` (one int64 per ``req_to_token`` row), and
the next step's input ids are gathered from there. Until its token arrives, a sequence carries the
placeholder ``-1`` as its last output id.

Finish checks (EOS, stop checker, length) therefore run one step late: a finished sequence may be part of
one more launched step, whose token is discarded. That step's KV slot lies within the sequence's
reservation (prompt + budget) and is freed with the sequence, so no KV leaks. Steps with a sequence
sampled on the host (a logits processor, a temperature or logprobs: ``engine.sampling.needs_host``) run
synchronously after the in-flight step. All device work stays on one stream, so a slot freed while a step
is in flight is reused only by later steps. The launched steps themselves are greedy only.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import torch

from engine.request import FinishReason, Sequence, stop_reason
from engine.sampling import needs_host
from engine.scheduler import ScheduledBatch

PLACEHOLDER = -1
log = logging.getLogger("diarist.engine")


@dataclass
class _InFlight:
    """A launched step: its batch, the sampled sequences with the output index of their placeholder, the
    pinned host buffer its tokens are copied into, and the event that marks the copy done."""

    batch: ScheduledBatch
    sampled: list[tuple[Sequence, int]]
    host: torch.Tensor
    event: torch.cuda.Event | None
    n_prefill: int


class OverlapLoop:
    """Drives ``engine`` with one step in flight. ``step()`` has the meaning of :meth:`Engine.step`."""

    def __init__(self, engine) -> None:
        self.e = engine
        dev = engine.device
        rows = engine.max_reqs + 1
        self.cuda = dev.type == "cuda"
        self.next_tok = torch.zeros(rows, dtype=torch.int64, device=dev)
        self.host = [torch.zeros(rows, dtype=torch.int64, pin_memory=self.cuda) for _ in range(2)]
        self.flip = 0
        self.pending: _InFlight | None = None

    def _to_dev(self, values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.int64).to(self.e.device, non_blocking=True)

    def step(self) -> bool:
        e = self.e
        e._drain()
        if self.pending is not None:
            for seq, idx in self.pending.sampled:
                if seq.finished:  # aborted while in flight
                    del seq.output_ids[idx:]
        batch = e.scheduler.schedule()
        if batch is None:
            if self.pending is None:
                return False
            _emit_finished(self._complete(self.pending))
            self.pending = None
            return True
        if any(needs_host(s) for s, _ in batch.items):
            if self.pending is not None:
                _emit_finished(self._complete(self.pending))
                self.pending = None
            batch.items = [(s, n) for s, n in batch.items if not s.finished]
            batch.admitted = [s for s in batch.admitted if not s.finished]
            if batch.items:
                e._run(batch)
            return True
        t0 = time.perf_counter()
        done: list[Sequence] = []
        try:
            launched = self._launch(batch)
            if self.pending is not None:
                done = self._complete(self.pending)
        except Exception as exc:  # noqa: BLE001 - as the sync loop: a failed step ends its sequences only
            self._fail(batch, exc)
            return True
        self.pending = launched
        dt = time.perf_counter() - t0
        for seq, n in batch.items:
            if seq.num_computed - n >= seq.prompt_len:
                seq.timings.decode_s += dt
            else:
                seq.timings.prefill_s += dt
        _emit_finished(done)  # after the accounting: a waiter woken by it reads the final timings
        return True

    def _fail(self, batch: ScheduledBatch, exc: Exception) -> None:
        log.exception("engine step failed (async decode)")
        self.e.counters["errors"] += 1
        seqs = [s for s, _ in batch.items] + ([s for s, _ in self.pending.sampled] if self.pending else [])
        self.pending = None
        for seq in seqs:
            while seq.output_ids and seq.output_ids[-1] == PLACEHOLDER:
                seq.output_ids.pop()
            if not seq.finished:
                seq.error = f"{type(exc).__name__}: {exc}"
                self.e.scheduler.finish(seq, FinishReason.ERROR)
            if not seq.done.is_set():  # also those a partly applied step finished before it failed
                seq.emit("finished", seq.finish_reason)

    def _launch(self, batch: ScheduledBatch) -> _InFlight:
        e = self.e
        if batch.admitted:
            t0 = time.perf_counter()
            for seq in batch.admitted:
                seq.emit("started")
            e.model.prepare(batch.admitted, e.cross)
            dt = time.perf_counter() - t0
            for seq in batch.admitted:
                seq.timings.encoder_s += dt
        fb, sample = e.runner.build(batch)
        fix_at, fix_rows = [], []
        for i, (seq, n) in enumerate(batch.items):
            last = seq.num_computed + n - 1
            if last >= seq.prompt_len and seq.token_at(last) == PLACEHOLDER:
                fix_at.append(int(fb.qo_indptr[i + 1]) - 1)
                fix_rows.append(seq.row)
        if fix_at:  # tokens sampled by the step still in flight (one copy for both index lists)
            idx = self._to_dev(fix_at + fix_rows)
            fb.input_ids[idx[: len(fix_at)]] = self.next_tok[idx[len(fix_at) :]]
        greedy = e.runner.forward_greedy(fb)
        want = [i for i, s in enumerate(sample) if s]
        host, event = self.host[self.flip][: len(want)], None
        self.flip ^= 1
        if want:
            rows = [batch.items[i][0].row for i in want]
            if len(want) == len(sample):
                dst = self._to_dev(rows)
            else:
                idx = self._to_dev(want + rows)
                greedy, dst = greedy[idx[: len(want)]], idx[len(want) :]
            self.next_tok[dst] = greedy
            host.copy_(greedy, non_blocking=self.cuda)
            if self.cuda:
                event = torch.cuda.Event()
                event.record()
        sampled = []
        for (seq, n), s in zip(batch.items, sample, strict=True):
            seq.num_computed += n
            if s:
                sampled.append((seq, len(seq.output_ids)))
                seq.output_ids.append(PLACEHOLDER)
        return _InFlight(batch, sampled, host, event, batch.num_prefill_tokens)

    def _complete(self, p: _InFlight) -> list[Sequence]:
        """Apply a finished step's tokens and the stop rules of :meth:`Scheduler.commit` (EOS unless
        ``ignore_eos``, then the stop checker, then the length budget), one step late. Returns the
        sequences it finished; the caller emits their ``finished`` once its accounting is done."""
        e = self.e
        if p.event is not None:
            p.event.synchronize()
        toks = p.host.tolist()
        done: list[Sequence] = []
        applied = 0
        now = time.perf_counter()
        for (seq, idx), tok in zip(p.sampled, toks, strict=True):
            if seq.finished:
                del seq.output_ids[idx:]
                continue
            applied += 1
            seq.output_ids[idx] = tok
            ahead = seq.output_ids[idx + 1 :]
            del seq.output_ids[idx + 1 :]  # the checker sees exactly the tokens so far
            reason = stop_reason(seq, tok)
            if seq.timings.first_token is None:
                seq.timings.first_token = now
            seq.emit("token", tok)
            if reason is not None:
                e.scheduler.finish(seq, reason)
                done.append(seq)
            else:
                seq.output_ids.extend(ahead)
        e.counters["steps"] += 1
        e.counters["prefill_tokens"] += p.n_prefill
        e.counters["decode_tokens"] += applied
        e.counters["finished"] += len(done)
        e._recent.append((now, p.n_prefill + applied))
        return done


def _emit_finished(done: list[Sequence]) -> None:
    for seq in done:
        seq.emit("finished", seq.finish_reason)
