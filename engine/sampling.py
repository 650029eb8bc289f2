"""Per-request sampling: greedy by default, temperature sampling with a per-sequence seeded generator.

Greedy (``temperature == 0``) stays the engine's default and its fast path: sequences without a logits
processor, a temperature or logprobs are sampled on the device (``argmax``, inside the decode CUDA graphs,
also by the async decode loop). Every other sequence is sampled on the host from float32 logits, in pure
torch, identically on a CPU and a GPU engine (the logits are copied to the host either way), so the CPU run
is the reference of the GPU one:

1. the sequence's ``logits_processor`` (if any) rewrites the raw logits ``x``;
2. ``temperature == 0``: ``argmax(x)``; else one draw from ``softmax(x / temperature)`` by
   ``torch.multinomial`` with the sequence's own ``torch.Generator`` seeded from ``seed`` (a fixed seed
   gives the same tokens on every run, whatever else is in the batch);
3. with ``logprobs``: ``log_softmax(x)[token]`` (the processed logits, before the temperature, as OpenAI
   Whisper's ``GreedyDecoder`` sums them) is appended to ``Sequence.output_logprobs``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch


@dataclass(frozen=True)
class SamplingParams:
    """How one sequence picks its tokens.

    Attributes:
        temperature: 0 for greedy (the default); > 0 divides the logits before a multinomial draw.
        seed: seed of the sequence's generator (used only when ``temperature > 0``); ``None`` seeds it from
            torch's global generator (not reproducible).
        logprobs: record each sampled token's log-probability in ``Sequence.output_logprobs``.

    Raises:
        ValueError: a negative or non-finite temperature.
    """

    temperature: float = 0.0
    seed: int | None = None
    logprobs: bool = False

    def __post_init__(self) -> None:
        if not math.isfinite(self.temperature) or self.temperature < 0:
            raise ValueError(f"temperature must be finite and >= 0, got {self.temperature!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


GREEDY = SamplingParams()


class SampledSequence(Protocol):
    """What sampling reads and writes of a sequence (:class:`engine.request.Sequence` provides it)."""

    sampling: SamplingParams
    logits_processor: Callable[..., torch.Tensor] | None
    generator: torch.Generator | None
    output_ids: list[int]
    output_logprobs: list[float]


def needs_host(seq: SampledSequence) -> bool:
    """True when ``seq`` must be sampled on the host (a logits processor, a temperature or logprobs)."""
    s = seq.sampling
    return seq.logits_processor is not None or not s.greedy or s.logprobs


def sample_on_host(seq: SampledSequence, logits: torch.Tensor) -> tuple[int, float | None]:
    """Pick ``seq``'s next token from its float32 host logits ``[vocab]`` (module docstring, steps 1-3).

    Returns ``(token id, log-probability or None)``; the caller appends the log-probability once the token
    is committed. Creates ``seq.generator`` on the first sampled step of a seeded sequence.
    """
    x = seq.logits_processor(seq, logits) if seq.logits_processor is not None else logits
    params = seq.sampling
    if params.greedy:
        tok = int(x.argmax())
    else:
        if seq.generator is None:
            seq.generator = torch.Generator(device="cpu")
            if params.seed is not None:
                seq.generator.manual_seed(params.seed)
            else:
                seq.generator.seed()
        probs = torch.softmax(x.float() / params.temperature, dim=-1)
        tok = int(torch.multinomial(probs, 1, generator=seq.generator))
    lp = float(torch.log_softmax(x.float(), dim=-1)[tok]) if params.logprobs else None
    return tok, lp


@dataclass
class SampledStep:
    """One step's sampled tokens: ``tokens[i]`` for ``batch.items[i]`` (``None`` where nothing is sampled: a
    prefill chunk that does not reach the prompt's end), and the log-probabilities of the host-sampled
    sequences that asked for them (attached by :func:`attach_logprobs` once the tokens are committed)."""

    tokens: list[int | None]
    logprobs: dict[SampledSequence, float]


def sample_step(items: list[tuple[SampledSequence, int]], logits: torch.Tensor, sample: list[bool]) -> SampledStep:
    """Pick the next token of every item whose ``sample`` flag is set, from the step's logits ``[B, vocab]``:
    greedy on the device (one ``argmax`` for the whole step), the sequences that :func:`needs_host` on the
    host (:func:`sample_on_host`, the logits copied once per step)."""
    greedy = logits.argmax(dim=-1).tolist()
    out: list[int | None] = []
    logprobs: dict[SampledSequence, float] = {}
    host = None
    for i, ((seq, _), want) in enumerate(zip(items, sample, strict=True)):
        if not want:
            out.append(None)
        elif needs_host(seq):
            if host is None:
                host = logits.float().cpu()
            tok, lp = sample_on_host(seq, host[i])
            out.append(tok)
            if lp is not None:
                logprobs[seq] = lp
        else:
            out.append(int(greedy[i]))
    return SampledStep(out, logprobs)


def attach_logprobs(logprobs: dict[SampledSequence, float]) -> None:
    """Append each committed token's log-probability (one per output id; none for a sequence aborted
    while its step ran, whose token was not appended)."""
    for seq, lp in logprobs.items():
        if len(seq.output_logprobs) < len(seq.output_ids):
            seq.output_logprobs.append(lp)
