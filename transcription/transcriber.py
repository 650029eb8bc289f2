"""From a recording to a speaker-attributed transcript: decode ▸ the model family's pipeline ▸ result.

The :class:`Transcriber` decodes the audio as its engine's family hears it, checks the family's bound and
hands the recording to that family's pipeline (:mod:`transcription.pipeline`: Whisper and the speaker
cascade in :mod:`transcription.whisper.pipeline`, MOSS-TD in :mod:`transcription.moss_td.pipeline`); it
then adds the fields every result ends with (:func:`transcription.result.finish_result`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from diarist.contract.options import TranscribeOptions
from diarist.contract.result import SpeakerEmbedding, TranscriptionResult
from engine.engine import Engine
from engine.request import RequestRejected
from transcription.audio import DecodedAudio, decode_audio
from transcription.audio.decode import downmix
from transcription.diarization.voices import result_spans, sample_embedding, speaker_embeddings
from transcription.errors import EngineError, Rejected
from transcription.limits import MIN_DURATION_S, too_short_message
from transcription.pipeline import pipeline_class
from transcription.progress import EventFn, begin_stage
from transcription.result import finish_result, speaker_hint_warnings
from transcription.speech import cascade_device

__all__ = ["EngineError", "TranscribeOptions", "Transcriber"]


class Transcriber:
    """Runs transcriptions on a shared :class:`Engine`; safe to call from many threads at once.

    ``fixed_output_tokens`` is a benchmark-only switch (``benchmarks/bench_service_gpu.py``): every
    sequence then decodes exactly that many tokens, EOS and the loop guard off, as the engine benchmark's
    requests do (``benchmarks/bench_engine.py``), so the service and the engine can be compared on the same
    work. It lives on this instance, never in a request, and is refused (``ValueError``) unless the engine
    runs random weights (``load_format="dummy"``) of a family whose pipeline takes it (MOSS-TD): a real
    model's transcript would be cut or padded.

    ``max_duration_s`` starts as the pipeline's bound and may be lowered on an instance.
    """

    def __init__(self, engine: Engine, fixed_output_tokens: int | None = None) -> None:
        self.engine = engine
        self.model_name: str | None = engine.loaded.info.get("name")
        cls = pipeline_class(engine)
        if fixed_output_tokens is not None and (engine.config.load_format != "dummy"
                                                or not cls.takes_fixed_output_tokens or fixed_output_tokens < 1):
            raise ValueError(f"fixed_output_tokens={fixed_output_tokens} is for benchmarks on dummy moss-td "
                             f"weights only (this engine: {engine.loaded.info.get('family')}, "
                             f"load_format={engine.config.load_format})")
        self.fixed_output_tokens = fixed_output_tokens
        self.pipeline = cls(engine, self.model_name, fixed_output_tokens)
        # each family hears its files as its official loader decodes them (transcription.audio.Frontend)
        self.frontend = self.pipeline.frontend
        self.max_duration_s = self.pipeline.max_duration_s

    # -- public ---------------------------------------------------------------------------------------
    def transcribe(self, source: Any, options: TranscribeOptions | None = None,
                   on_event: EventFn | None = None, should_cancel: Callable[[], bool] | None = None
                   ) -> TranscriptionResult:
        """Transcribe a recording (path, bytes, binary file object, or audio its caller decoded:
        :class:`transcription.audio.DecodedAudio`).

        Returns:
            A :class:`TranscriptionResult` (the fields of its JSON form, ``to_json``): ``duration`` (s),
            ``language`` (code, or ``None``), ``language_source``
            (``requested``, ``detected``, ``assumed``; :class:`transcription.language.LanguageChoice`),
            ``language_probability`` (detected only), ``task``, ``model``, ``segments`` [{speaker, start, end,
            text, words?}], ``finish_reason``, ``speech`` (detected speech ``[[start, end], ...]``),
            ``coverage`` / ``incomplete`` / ``incomplete_reason`` (:mod:`diarist.completeness`), ``no_speech``,
            ``warnings`` ([{code, message, count}], e.g. NaN samples replaced),
            ``metrics`` {queue_wait_s, encoder_s, prefill_s, decode_s, vad_s, diarization_s,
            prompt_tokens, output_tokens, processing_s, audio_decode_s, rtf}.
        ``should_cancel`` is polled before the windows are submitted, while the engine works and inside
        diarization; once it returns True no further window is submitted, the recording's sequences are
        aborted at once (their KV is freed), diarization is skipped or stopped where it is, and the result
        has finish_reason ``abort`` (no turns).

        Every error raised is a :class:`diarist.contract.errors.CodedError`:

        Raises:
            AudioError: undecodable input (codes in :class:`transcription.audio.AudioError`).
            Rejected: (also an :class:`engine.request.RequestRejected`) the recording cannot fit the model's
                context, or is longer than its pipeline's bound (``too_long``, :mod:`transcription.limits`), or
                shorter than :data:`transcription.limits.MIN_DURATION_S` (``too_short``); a language the model does not
                transcribe (``unsupported_language``); a task it cannot do (``unsupported_task``: translate
                on an English-only model or on MOSS-TD).
            EngineError: a sequence failed inside the engine.
        """
        try:
            return TranscriptionResult.from_json(self._transcribe(source, options or TranscribeOptions(), on_event,
                                                                  should_cancel))
        except Rejected:
            raise
        except RequestRejected as e:  # the engine's own refusal: a coded error of the contract from here on
            raise Rejected.of(e) from e

    def sample_voice(self, source: Any, max_duration_s: float) -> tuple[SpeakerEmbedding | None, float]:
        """The voice vector of an enrollment sample (one talker; path, bytes, file object or
        :class:`DecodedAudio`) and the sample's duration in seconds
        (:func:`transcription.diarization.voices.sample_embedding`; ``None`` when it holds no speech).

        Raises:
            AudioError: undecodable input.
            Rejected: ``too_long``: the sample lasts more than ``max_duration_s`` (checked before any model runs).
        """
        audio = source if isinstance(source, DecodedAudio) else decode_audio(source, frontend=self.frontend)
        if audio.duration > max_duration_s:
            raise Rejected("too_long", f"the sample lasts {audio.duration:.0f} s; a voice sample may last at most "
                                       f"{max_duration_s:g} s")
        return sample_embedding(audio.mono, device=cascade_device(self.engine)), audio.duration

    def _transcribe(self, source: Any, opts: TranscribeOptions, on_event: EventFn | None,
                    should_cancel: Callable[[], bool] | None) -> dict:
        self.pipeline.check(opts)
        t0 = time.perf_counter()
        if isinstance(source, DecodedAudio):  # decoded by the caller (a worker): nothing to do here
            audio = source if opts.multichannel or source.samples.shape[0] == 1 else replace(
                source, samples=downmix(source.samples, self.frontend))
        else:
            begin_stage(on_event, "decode")
            audio = decode_audio(source, mono=not opts.multichannel, frontend=self.frontend)
        audio_decode_s = time.perf_counter() - t0
        if audio.duration > self.max_duration_s:  # the pipeline's memory bound
            raise Rejected("too_long", f"the audio lasts {audio.duration:.0f} s; {self.pipeline.bound_holder} "
                                       f"takes at most {self.max_duration_s:g} s ({self.max_duration_s / 3600:g} h)")
        if audio.duration < MIN_DURATION_S:
            raise Rejected("too_short", too_short_message(audio.duration))
        if on_event:
            on_event("queued", {"duration": audio.duration})
        result = self.pipeline.transcribe(audio, opts, on_event, should_cancel)
        if not opts.multichannel and result.get("finish_reason") != "abort":
            # every family's speakers get a voice vector, for known-speaker identification by the service
            t_voice = time.perf_counter()
            voices = speaker_embeddings(audio.mono, result_spans(result, audio.duration), device=cascade_device(self.engine),
                                        should_cancel=should_cancel)
            result["speaker_embeddings"] = [v.to_json() for v in voices]
            result.setdefault("metrics", {})["speaker_embedding_s"] = time.perf_counter() - t_voice
        result["warnings"] = result.get("warnings", []) + speaker_hint_warnings(result, opts.num_speakers,
                                                                               opts.min_speakers)
        finish_result(result, audio.duration, time.perf_counter() - t0, audio_decode_s, audio.warnings,
                      self.engine.random_weights)
        if on_event:
            on_event("finished", {"metrics": result["metrics"], "finish_reason": result["finish_reason"]})
        return result
