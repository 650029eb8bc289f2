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
from dataclasses import dataclass

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


def needs_host(seq) -> bool:
    """True when ``seq`` must be sampled on the host (a logits processor, a temperature or logprobs)."""
    s = seq.sampling
    return seq.logits_processor is not None or not s.greedy or s.logprobs


def sample_on_host(seq, logits: torch.Tensor) -> tuple[int, float | None]:
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
