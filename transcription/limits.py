"""How long a recording each model family takes, and why (torch-free: the API checks it at submit).

- **Whisper cascade** (``whisper``): windows of at most 30 s decode independently, so the model has no
  length limit; memory grows with the recording only through what the pipeline keeps for all of it: the
  16 kHz float32 samples (230 MB per hour), each window's log-mel (115 MB per hour) and, for word
  alignment, its encoder output (tiny.en: 276 MB per hour) until the transcript is assembled, the
  segmentation model's per-chunk output (24 MB per hour) and the clustering's pairwise distances (quadratic:
  about 0.7 GB at 6 h). The bound is :data:`WHISPER_MAX_DURATION_S` (6 h). Measured peak RSS
  (``benchmarks/bench_long_recording.py``, results ``benchmarks/results/long_recording_cpu_*.json``).
- **MOSS-TD** (``moss-td``): one sequence holds the whole recording, so the limit is what its context
  holds: the prompt (12.5 audio tokens per second, the time-marker digits, the chat template) plus the
  default output budget (:func:`default_budget`, 10 tokens per audio second) within
  :data:`MOSS_TD_CONTEXT` positions; :func:`moss_td_max_duration_s` solves for it (89.4 minutes).
  The engine checks the exact prompt of each request again (``too_long``), so a longer custom
  instruction is refused there with both numbers.
"""

from __future__ import annotations

import math

from transcription.audio import SAMPLE_RATE

DEFAULT_MARKER_EVERY_S = 2  # engine.models.moss_td_prompt's default (the test checks they agree)
MIN_DURATION_S = 0.1
"""Shortest recording taken (seconds); shorter ones are refused ``too_short`` at the API's intake (where
``DIARIST_MIN_DURATION_S`` may raise it) and by the transcriber (the CLI, the engine server). 0.1 s is the
minimum of OpenAI's transcription API, whose routes we mirror; a shorter clip holds at most a fragment of
one phoneme (speech sounds last about 50-200 ms), so no transcript of it could be right, and refusing it
says so where an empty ``no_speech`` transcript would claim silence."""
WHISPER_MAX_DURATION_S = 6 * 3600.0
"""Longest recording the Whisper cascade takes (seconds); see the module docstring for the memory it needs."""
MOSS_TD_CONTEXT = 131_072
"""Positions of MOSS-TD's decoder (Qwen3 with the official code's ``max_position_embeddings``)."""
OUTPUT_TOKENS_PER_S = 10.0
"""Default MOSS-TD output budget per audio second (2x the ~4.5 tokens/s of speech-dense audio)."""
MIN_BUDGET_TOKENS = 512
"""Default MOSS-TD output budget floor (tokens)."""
TEMPLATE_TOKENS = 128
"""Upper bound on the chat template's tokens around the audio span (the default instruction makes 86)."""
MOSS_TD_MAX_DURATION_S = 5367.2
"""``moss_td_max_duration_s()`` for the defaults, kept as a number so that the API checks it without importing
the model's audio facts (which import torch); ``tests/transcription/test_limits.py`` checks they agree."""


def default_budget(duration_s: float, checkpoint_default: int | None = None) -> int:
    """MOSS-TD output tokens allowed when the request sets none: ``max(min(D, 512), ceil(10 * duration_s))`` with
    ``D`` the checkpoint's ``generation_config.json`` ``max_new_tokens`` (sglang-omni #1034; 512 when unstated).

    The official ``generate`` would stop every recording at ``D`` itself (5120 in the released checkpoint,
    about 19 minutes of a dense meeting: OpenMOSS#26), so ``D`` only lowers the floor for short clips."""
    floor = MIN_BUDGET_TOKENS if checkpoint_default is None else min(int(checkpoint_default), MIN_BUDGET_TOKENS)
    return max(floor, math.ceil(OUTPUT_TOKENS_PER_S * duration_s))


def moss_td_prompt_tokens(duration_s: float, marker_every_s: int = DEFAULT_MARKER_EVERY_S) -> int:
    """Prompt tokens of a ``duration_s`` recording: its audio tokens, one digit token per digit of each
    time marker, and :data:`TEMPLATE_TOKENS` for the template (an upper bound)."""
    from engine.models.moss_td_prompt import TOKENS_PER_SECOND, window_token_counts  # imports torch

    samples = round(duration_s * SAMPLE_RATE)
    audio = sum(window_token_counts(samples))
    digits = 0
    if marker_every_s:
        last = int(audio / TOKENS_PER_SECOND)
        digits = sum(len(str(s)) for s in range(marker_every_s, last + 1, marker_every_s))
    return audio + digits + TEMPLATE_TOKENS


def moss_td_max_duration_s(context: int = MOSS_TD_CONTEXT, marker_every_s: int = DEFAULT_MARKER_EVERY_S) -> float:
    """Longest recording (seconds, to 0.1 s) whose prompt plus default output budget fits ``context``."""
    from engine.models.moss_td_prompt import SAMPLES_PER_TOKEN

    def fits(d: float) -> bool:
        return moss_td_prompt_tokens(d, marker_every_s) + default_budget(d) <= context

    lo, hi = 0.0, context * SAMPLES_PER_TOKEN / SAMPLE_RATE  # every audio token alone already exceeds hi
    while hi - lo > 0.1:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return math.floor(lo * 10) / 10


MAX_DURATION_S: dict[str, float] = {"whisper": WHISPER_MAX_DURATION_S, "moss-td": MOSS_TD_MAX_DURATION_S}
"""The longest recording (seconds) each family takes at submit (keys: :data:`engine.config.MODEL_FAMILIES`)."""


def too_short_message(duration_s: float, minimum_s: float = MIN_DURATION_S) -> str:
    """The ``too_short`` refusal's message (one wording for the API, the engine server and the CLI)."""
    return f"the audio lasts {duration_s:.3g} s; the minimum is {minimum_s:g} s"


def max_duration_s(family: str) -> float:
    """The longest recording (seconds) the ``family`` (``whisper`` or ``moss-td``) takes; ``ValueError`` for
    another family."""
    try:
        return MAX_DURATION_S[family]
    except KeyError:
        raise ValueError(f"unknown model family {family!r}") from None
