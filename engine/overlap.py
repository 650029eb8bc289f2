"""Async decode (one-step lookahead): step N+1 is launched before the host reads step N's tokens.

On by default for CUDA (``EngineConfig.async_decode``). :class:`LookaheadSteps` is a kind of step of the
engine's one loop (:mod:`engine.step_loop`), which does the admission, timing, counting and failure
handling. Each loop iteration: schedule step N+1 from the optimistic state, launch it, then wait for step
N's tokens and apply them. Sampled tokens never wait on the host to feed the next step: they are written on
the device into ``next_tok[row]`` (one int64 per ``req_to_token`` row), and the next step's input ids are
gathered from there. Until its token arrives, a sequence carries the
placeholder ``-1`` as its last output id.

Finish checks (EOS, stop checker, length) therefore run one step late: a finished sequence may be part of
one more launched step, whose token is discarded. That step's KV slot lies within the sequence's
reservation (prompt + budget) and is freed with the sequence, so no KV leaks. Steps with a sequence
sampled on the host (a logits processor, a temperature or logprobs: ``engine.sampling.needs_host``) run
synchronously after the in-flight step. All device work stays on one stream, so a slot freed while a step
is in flight is reused only by later steps. The launched steps themselves are greedy only.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from engine.request import Sequence, stop_reason
from engine.scheduler import ScheduledBatch, Scheduler
from engine.step_loop import Completed

if TYPE_CHECKING:
    from engine.runner import ModelRunner

PLACEHOLDER = -1
"""The last output id of a sequence whose token is still in flight."""


@dataclass
class DeviceTokens:
    """A launched step's tokens on their way to the host: the sampled sequences with the output index of
    their placeholder, the pinned host buffer the tokens are copied into, and the event that marks the
    copy done (``None`` on the CPU)."""

    sampled: list[tuple[Sequence, int]]
    host: torch.Tensor
    event: torch.cuda.Event | None


class LookaheadSteps:
    """Greedy steps whose tokens stay on the device for the next launch (module docstring): a
    :class:`engine.step_loop.StepKind`. ``rows`` is the ``req_to_token`` row count (``max_reqs + 1``)."""

    def __init__(self, runner: ModelRunner, scheduler: Scheduler, device: torch.device, rows: int) -> None:
        self.runner = runner
        self.scheduler = scheduler
        self.device = device
        self.cuda = device.type == "cuda"
        self.next_tok = torch.zeros(rows, dtype=torch.int64, device=device)
        self.host = [torch.zeros(rows, dtype=torch.int64, pin_memory=self.cuda) for _ in range(2)]
        self.flip = 0

    def _to_dev(self, values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.int64).to(self.device, non_blocking=True)

    def drop_aborted(self, work: DeviceTokens) -> None:
        """Before the next step is scheduled: a sequence aborted while its step is in flight loses the
        placeholder (and anything after it), so it is never scheduled from it."""
        for seq, idx in work.sampled:
            if seq.finished:
                del seq.output_ids[idx:]

    def abandon(self, seq: Sequence) -> None:
        """A failed step: drop the placeholders of tokens that will never be read."""
        while seq.output_ids and seq.output_ids[-1] == PLACEHOLDER:
            seq.output_ids.pop()

    def launch(self, batch: ScheduledBatch) -> DeviceTokens:
        """Launch ``batch`` (admitted already): input ids of sequences whose last token is still in flight are
        gathered from ``next_tok``, the greedy tokens go to ``next_tok`` and, asynchronously, to a pinned
        host buffer; each sampled sequence gets a placeholder output id and its tokens counted computed."""
        runner = self.runner
        fb, sample = runner.build(batch)
        fix_at, fix_rows = [], []
        for i, (seq, n) in enumerate(batch.items):
            last = seq.num_computed + n - 1
            if last >= seq.prompt_len and seq.token_at(last) == PLACEHOLDER:
                fix_at.append(int(fb.qo_indptr[i + 1]) - 1)
                fix_rows.append(seq.row)
        if fix_at:  # tokens sampled by the step still in flight (one copy for both index lists)
            idx = self._to_dev(fix_at + fix_rows)
            fb.input_ids[idx[: len(fix_at)]] = self.next_tok[idx[len(fix_at) :]]
        greedy = runner.forward_greedy(fb)
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
        return DeviceTokens(sampled, host, event)

    def complete(self, batch: ScheduledBatch, p: DeviceTokens) -> Completed:
        """Apply a finished step's tokens and the stop rules of :meth:`Scheduler.commit` (EOS unless
        ``ignore_eos``, then the stop checker, then the length budget), one step late, and emit their
        ``token`` events. Returns the sequences it finished; the loop emits their ``finished`` once its
        accounting is done."""
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
                self.scheduler.finish(seq, reason)
                done.append(seq)
            else:
                seq.output_ids.extend(ahead)
        return Completed(done, applied)
