"""What a model family's pipeline provides (:class:`FamilyPipeline`), and which pipeline serves which family.

A :class:`transcription.transcriber.Transcriber` decodes the audio with its pipeline's frontend, checks the
pipeline's bound, and hands the recording over; it never asks which family it runs. Adding a family is a
module with a class of this shape and one line in :data:`PIPELINES`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar, Protocol

from diarist.contract.options import TranscribeOptions
from engine.engine import Engine
from transcription.audio import DecodedAudio, Frontend
from transcription.moss_td.pipeline import MossTdPipeline
from transcription.progress import EventFn
from transcription.whisper.pipeline import WhisperPipeline


class FamilyPipeline(Protocol):
    """One model family's way from decoded audio to an engine result dict.

    Attributes:
        family: the model family it serves, as the engine's loader reports it (``info["family"]``).
        frontend: how its files are decoded (its official loader's channel mix and resampler).
        max_duration_s: longest recording (seconds) it is given; longer ones are refused ``too_long``
            after decoding (by the engine server before a PCM body is read).
        bound_holder: who sets that bound, for the refusal's message ("the Whisper cascade").
        takes_fixed_output_tokens: whether the benchmark-only ``fixed_output_tokens`` switch applies
            (every sequence decodes exactly that many tokens).
    """

    family: ClassVar[str]
    frontend: ClassVar[Frontend]
    max_duration_s: ClassVar[float]
    bound_holder: ClassVar[str]
    takes_fixed_output_tokens: ClassVar[bool]

    def __init__(self, engine: Engine, model_name: str | None, fixed_output_tokens: int | None = None) -> None:
        """Bind to a loaded ``engine``; ``fixed_output_tokens`` is ``None`` unless
        ``takes_fixed_output_tokens`` (the transcriber refuses it before)."""

    def check(self, opts: TranscribeOptions) -> None:
        """Refuse what the model cannot do before any audio is decoded.

        Raises:
            Rejected: ``unsupported_language``, ``unsupported_task``.
        """

    def transcribe(self, audio: DecodedAudio, opts: TranscribeOptions, on_event: EventFn | None,
                   should_cancel: Callable[[], bool] | None) -> dict:
        """The engine result dict of ``audio`` (fields: :meth:`Transcriber.transcribe`), without the fields
        :func:`transcription.result.finish_result` adds.

        Raises:
            RequestRejected: the engine refused a sequence (``too_long``, ``kv_capacity``, ...).
            EngineError: a sequence failed inside the engine.
        """


PIPELINES: dict[str, type[FamilyPipeline]] = {p.family: p for p in (WhisperPipeline, MossTdPipeline)}
"""The pipeline of each model family, by the family its loader reports (``engine.loaded.info["family"]``);
its keys are :data:`engine.config.MODEL_FAMILIES` (``tests/transcription/test_pipeline.py`` checks they agree)."""


def pipeline_class(engine: Engine) -> type[FamilyPipeline]:
    """The pipeline class of ``engine``'s loaded family (``ValueError`` for a family without one)."""
    family = engine.loaded.info.get("family")
    try:
        return PIPELINES[family]
    except KeyError:
        raise ValueError(f"no transcription pipeline for model family {family!r}") from None
