"""Known speakers: matching a recording's voices to an API key's voice profiles (torch-free).

A voice is a :class:`diarist.contract.result.SpeakerEmbedding` (the L2-normalised CAM++ centroid of a
speaker's speech); a profile's vector is the speech-weighted mean of its samples' vectors, normalised
(:func:`profile_vector`). :func:`match` names speakers:

1. score every (speaker, profile) pair by cosine similarity (the dot product of unit vectors); a profile
   made by another embedding model never scores;
2. assign speakers to profiles one-to-one, maximising the total score over the pairs at or above the
   threshold (Hungarian algorithm, ``scipy.optimize.linear_sum_assignment``), so two speakers never get
   the same profile;
3. keep the pairs that score at or above the threshold: a voice below it stays unnamed (never forced).

The threshold is ``Settings.speaker_match_threshold``; its default was chosen on
``benchmarks/bench_speaker_id.py`` (result file ``benchmarks/results/speaker_id_cpu.json``, rule and numbers
in docs/service.md, Known speakers).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np
from scipy.optimize import linear_sum_assignment

from diarist.contract.result import SpeakerEmbedding


class VoiceEmbedder(Protocol):
    """How the API gets the voice vector of an enrollment sample without loading a model itself: the
    in-process transcriber (embedded mode) or the engine server's ``POST /internal/embed``
    (``engine_server.client``), injected as ``Services.voices`` by the CLI."""

    def sample_voice(self, audio: Path, max_duration_s: float) -> tuple[SpeakerEmbedding | None, float]:
        """The sample's voice vector (``None``: no speech in it) and its duration in seconds.

        Raises:
            CodedError: undecodable audio (``decode_failed``, ``no_audio_stream``, ``empty_audio``...),
                ``too_long`` (more than ``max_duration_s``), ``engine_unavailable`` (the engine is down).
        """


@dataclass(frozen=True)
class ProfileVoice:
    """What matching needs of a voice profile: its ``id``, ``name``, ``model`` (the embedding model's id) and
    unit ``vector`` (float32 ``[d]``)."""

    id: str
    name: str
    model: str
    vector: np.ndarray


@dataclass(frozen=True)
class Match:
    """A speaker named by a profile: ``profile_id``, ``name`` and ``score`` (cosine similarity, in [-1, 1])."""

    profile_id: str
    name: str
    score: float


def profile_vector(vectors: Sequence[Sequence[float]], seconds: Sequence[float]) -> np.ndarray:
    """The speech-weighted mean of sample vectors, L2-normalised: float32 ``[d]``.

    Raises:
        ValueError: no vectors, or vectors of different lengths.
    """
    if not vectors:
        raise ValueError("a profile needs at least one sample")
    x = np.asarray(vectors, np.float32)
    w = np.maximum(np.asarray(seconds, np.float32), 1e-3)
    c = (x * w[:, None]).sum(0)
    return c / max(float(np.linalg.norm(c)), 1e-12)


def scores(voices: Sequence[SpeakerEmbedding], profiles: Sequence[ProfileVoice]) -> np.ndarray:
    """Cosine similarity ``[len(voices), len(profiles)]`` float32; ``-inf`` where the models differ."""
    out = np.full((len(voices), len(profiles)), -np.inf, np.float32)
    for i, v in enumerate(voices):
        a = np.asarray(v.vector, np.float32)
        a = a / max(float(np.linalg.norm(a)), 1e-12)
        for j, p in enumerate(profiles):
            if p.model == v.model and p.vector.shape == a.shape:
                out[i, j] = float(a @ p.vector)
    return out


def match(voices: Sequence[SpeakerEmbedding], profiles: Sequence[ProfileVoice], threshold: float
          ) -> dict[int, Match]:
    """Name the voices that match a profile: voice index -> :class:`Match` (steps 1-3 of the module doc).

    Each profile names at most one voice and each voice gets at most one profile; only pairs scoring
    ``>= threshold`` are kept. Empty when there are no voices or no profiles.
    """
    if not voices or not profiles:
        return {}
    sim = scores(voices, profiles)
    ok = sim >= threshold
    # below the threshold a pair must not be chosen over leaving both unmatched: it weighs nothing
    gain = np.where(ok, sim - threshold + 1.0, 0.0)
    rows, cols = linear_sum_assignment(gain, maximize=True)
    return {int(i): Match(profiles[j].id, profiles[j].name, round(float(sim[i, j]), 4))
            for i, j in zip(rows, cols, strict=True) if ok[i, j]}
