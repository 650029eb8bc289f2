"""The Whisper family's pipeline: VAD ▸ windows of at most 30 s ▸ engine ▸ alignment ▸ speaker cascade.

silero-vad finds speech; speech is packed into windows of at most 30 s; all windows of a recording are
submitted together, so they decode in one batch (and alongside other recordings); each window's timestamp
tokens plus its offset give segment times, clamped to ``[0, duration]``; word times come from the
cross-attention alignment heads; speaker turns from the embedding cascade are assigned to words. With
``multichannel`` each channel is transcribed on its own and labelled by channel.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from diarist.contract.options import TranscribeOptions
from engine.engine import Engine
from engine.request import EventInbox, FinishReason, Sequence
from engine.sampling import SamplingParams
from transcription.audio import SAMPLE_RATE, DecodedAudio, Frontend, log_mel_spectrogram
from transcription.cancel import Canceled
from transcription.decode_quality import temperature_schedule
from transcription.language import CHARACTER_LANGUAGES, LanguageChoice, WhisperLanguages
from transcription.limits import WHISPER_MAX_DURATION_S
from transcription.options import window_budget
from transcription.progress import EventFn, begin_stage
from transcription.repetition import RepetitionGuard
from transcription.result import merge_channels, sequence_metrics, whisper_result
from transcription.speech import SpeechConfidence, cascade_device, detect_speech, speaker_stage
from transcription.whisper.decoding import (
    FORCED_START,
    WhisperTimestampRules,
    WhisperTokens,
    WindowStart,
    whisper_prompt,
)
from transcription.whisper.segments import WindowSegments
from transcription.whisper.window_decoder import WindowDecoder, WindowResult
from transcription.whisper.window_outcome import (
    incomplete_reason,
    window_finish,
    window_metrics,
    window_warnings,
)
from transcription.whisper.windows import Window, pack_windows

WHISPER_LOOP_MIN_SPAN = 48
"""Tokens a repeating tail must cover before a Whisper window is stopped (of its 448-token context)."""


class WhisperPipeline:
    """A :class:`transcription.pipeline.FamilyPipeline` for Whisper checkpoints (one per engine; safe to
    call from many threads at once: per-recording state lives in each call).

    ``speaker_stage``: where the VAD's segmentation pass and the speaker cascade's networks run: the
    device's shared :class:`transcription.diarization.stage.SpeakerStage` on CUDA (recordings of all
    requests batched together), ``None`` on the CPU (each request runs them itself: the reference path).
    Set it on the instance to choose.

    Its tokens, timestamp rules, alignment heads and languages come from the checkpoint's config
    (``engine.loaded.info["config"]``). ``fixed_output_tokens`` is always ``None`` here (the transcriber
    refuses it for this family: ``takes_fixed_output_tokens``).
    """

    family = "whisper"  # engine.loaded.info["family"] of the engines it serves
    frontend = Frontend.for_family(family)
    max_duration_s = WHISPER_MAX_DURATION_S  # the cascade's memory bound (transcription.limits)
    bound_holder = "the Whisper cascade"
    takes_fixed_output_tokens = False  # each window's budget follows its duration; no benchmark switch

    def __init__(self, engine: Engine, model_name: str | None, fixed_output_tokens: int | None = None) -> None:
        self.engine, self.model_name = engine, model_name
        self.cascade_device = cascade_device(engine)
        self.speaker_stage = speaker_stage(self.cascade_device)
        conf = engine.loaded.info.get("config", {})
        self.tokens = WhisperTokens.from_vocab(engine.model.config.vocab_size)
        self.rules = WhisperTimestampRules(self.tokens, conf.get("suppress_ids", []),
                                           conf.get("suppress_ids_begin", [220, self.tokens.eot]))
        self.alignment_heads = conf.get("alignment_heads", [])
        self.segments = WindowSegments(engine.model, engine.tokenizer, self.tokens, self.alignment_heads)
        self.languages = WhisperLanguages(engine.tokenizer, self.tokens, conf.get("lang_ids", []))

    def check(self, opts: TranscribeOptions) -> None:
        """Refuse a language the checkpoint does not transcribe or a task it cannot do
        (:meth:`WhisperLanguages.check`: ``Rejected``)."""
        self.languages.check(opts.language, opts.task, self.model_name)

    def transcribe(self, audio: DecodedAudio, opts: TranscribeOptions, on_event: EventFn | None,
                   should_cancel: Callable[[], bool] | None) -> dict:
        """The engine result dict of ``audio`` (see :meth:`transcription.transcriber.Transcriber.transcribe`),
        before :func:`transcription.result.finish_result`."""
        if opts.multichannel and audio.samples.shape[0] > 1:
            return self._multichannel(audio.samples, opts, on_event, should_cancel)
        return self._whisper(audio.mono, opts, on_event, opts.diarize, should_cancel)

    def _speech(self, wave: np.ndarray, should_cancel: Callable[[], bool] | None = None
                ) -> tuple[list[tuple[float, float]], SpeechConfidence | None]:
        stage = self.speaker_stage
        return detect_speech(wave, self.cascade_device, should_cancel, None if stage is None else stage.segment)

    def _whisper(self, wave: np.ndarray, opts: TranscribeOptions, on_event: EventFn | None,
                 diarize: bool, should_cancel: Callable[[], bool] | None = None) -> dict:
        duration = len(wave) / SAMPLE_RATE
        t_vad = time.perf_counter()
        begin_stage(on_event, "speech_detection")
        try:
            speech, vad_confidence = self._speech(wave, should_cancel)
        except Canceled:  # stopped between the VAD's blocks: the abort result below, no window submitted
            speech, vad_confidence = [], None
        vad_s = time.perf_counter() - t_vad
        windows = pack_windows(speech)
        metrics: dict[str, Any] = {"vad_s": vad_s, "windows": len(windows), "speech_s": sum(e - s for s, e in speech),
                                   "speech_end_s": max((e for _, e in speech), default=0.0)}
        canceled = should_cancel is not None and should_cancel()
        if not windows or canceled:  # canceled while decoding or VAD ran: no window reaches the engine
            metrics.update(queue_wait_s=0.0, encoder_s=0.0, prefill_s=0.0, decode_s=0.0, diarization_s=0.0,
                           prompt_tokens=0, output_tokens=0)
            finish_reason = FinishReason.ABORT if canceled else FinishReason.STOP
            choice = self.languages.choose(opts.language, opts.task, lambda: None)
            result = whisper_result(self.model_name, duration, [], finish_reason.value, metrics,
                                    no_speech=not canceled, language=choice, speech=speech)
            result["windows"] = []
            if diarize and not canceled:
                result["turns"] = []  # the cascade's answer for a recording without speech: nobody spoke
            return result
        want_words = diarize and opts.word_timestamps
        begin_stage(on_event, "transcription")
        # a multilingual model without a requested language detects it in every window, at the step that
        # also gives the no-speech probability (WindowStart): code-switched speech keeps each language
        choice = self.languages.choose(opts.language, opts.task, lambda: None)
        decoder = self._decoder(wave, speech, opts, on_event, want_words, vad_confidence, choice)
        results = decoder.run(windows, should_cancel)
        detected = self.languages.can_detect and not opts.language
        if detected:
            choice = self._recording_language(results, opts.task)
        seqs = decoder.sequences
        segments = [seg for r in results for seg in r.segments]
        finish = window_finish(results, decoder.canceled).value
        metrics.update(window_metrics(results, seqs))
        t_d = time.perf_counter()
        turns = None
        if diarize and segments and finish != FinishReason.ABORT.value:  # nobody reads an aborted result
            begin_stage(on_event, "speakers")
            try:
                segments, turns = self._diarize(wave, speech, segments, opts, should_cancel)
            except Canceled:  # canceled after recognition: the cascade stopped where it was
                finish = FinishReason.ABORT.value
        if turns is None:
            for seg in segments:
                seg["speaker"] = 0
        metrics["diarization_s"] = time.perf_counter() - t_d
        metrics.update(sequence_metrics(seqs))
        # no speech: nothing was heard and every window said so (a window cut at its token limit before
        # its first segment ended has speech that was not transcribed: that is incomplete, not silence)
        no_speech = not segments and all(r.status == "no_speech" for r in results)
        result = whisper_result(self.model_name, duration, segments, finish, metrics, no_speech=no_speech,
                                language=choice, speech=speech)
        result["windows"] = [r.as_dict() | self._window_language(r) for r in results]
        if detected:
            result["languages"] = self._language_seconds(results)
        # windows the model judged non-speech leave the coverage denominator (diarist.completeness)
        result["non_speech"] = [[w["start"], w["end"]] for w in result["windows"] if w["status"] == "no_speech"]
        if finish != FinishReason.ABORT.value and (reason := incomplete_reason(results)) is not None:
            result["incomplete"], result["incomplete_reason"] = True, reason
        if finish != FinishReason.ABORT.value:
            result["warnings"] = result.get("warnings", []) + window_warnings(results, self.tokens.english_only)
        if diarize and finish != FinishReason.ABORT.value:  # no segments: nobody spoke, no turns
            result["turns"] = turns if turns is not None else []
        return result

    def _window_language(self, r: WindowResult) -> dict:
        """``{"language", "language_probability"}`` of a multilingual window (the probability only when it
        was detected); ``{}`` for an English-only model."""
        lid = r.seq.mm_state.get("language_id")
        if lid is None:
            return {}
        p = r.seq.mm_state.get("language_probability")
        return {"language": self.languages.code_of.get(lid), "language_probability": None if p is None else round(p, 4)}

    def _language_seconds(self, results: list[WindowResult]) -> list[dict]:
        """``[{"language", "seconds"}]``: seconds of transcribed windows per detected language, most first."""
        secs: dict[str, float] = {}
        for r in results:
            code = self._window_language(r).get("language")
            if code is not None and r.status != "no_speech" and r.segments:
                secs[code] = secs.get(code, 0.0) + (r.end - r.window.start)
        return [{"language": c, "seconds": round(v, 3)} for c, v in sorted(secs.items(), key=lambda kv: -kv[1])]

    def _recording_language(self, results: list[WindowResult], task: str) -> LanguageChoice:
        """The recording's language when each window detected its own: the language of the most transcribed
        seconds, with its windows' mean probability weighted by their seconds; no language (``None``) when
        no window had text."""
        weight: dict[str, float] = {}
        mass: dict[str, float] = {}
        for r in results:
            lang = self._window_language(r)
            if lang.get("language") is None or r.status == "no_speech" or not r.segments:
                continue
            sec = max(r.end - r.window.start, 1e-6)
            weight[lang["language"]] = weight.get(lang["language"], 0.0) + sec
            mass[lang["language"]] = mass.get(lang["language"], 0.0) + sec * (lang["language_probability"] or 0.0)
        if not weight:
            return LanguageChoice(None, None, None, task)
        code = max(weight, key=lambda c: weight[c])
        return LanguageChoice(code, "detected", mass[code] / weight[code], task)

    def _mel(self, wave: np.ndarray, w: Window) -> torch.Tensor:
        chunk = torch.from_numpy(wave[int(w.start * SAMPLE_RATE) : int(w.end * SAMPLE_RATE)])
        return log_mel_spectrogram(chunk, self.engine.model.config.num_mel_bins)[0]

    def _decoder(self, wave: np.ndarray, speech: list[tuple[float, float]], opts: TranscribeOptions,
                 on_event: EventFn | None, want_words: bool, vad_confidence: SpeechConfidence | None,
                 choice: LanguageChoice) -> WindowDecoder:
        """A :class:`WindowDecoder` for one recording: attempts share the prompt (in ``choice``'s language
        and task), rules, options and one event inbox (listeners run on the decoder's thread)."""
        language_id, task_id = self.languages.prompt_ids(choice)
        prompt_ids = self.engine.tokenizer.encode(" " + opts.prompt.strip()) if opts.prompt else None
        # multilingual: language (requested, else detected per window) and task are the first two outputs
        start = None if task_id is None else WindowStart(
            task_id, language_id if choice.code else None, None if choice.code else self.languages.ids)
        prompt = whisper_prompt(self.tokens, prompt_ids, forced_start=start is not None)
        inbox = EventInbox(batch_s=self.engine.config.stream_interval_s)
        keep = want_words and bool(self.alignment_heads)
        duration = len(wave) / SAMPLE_RATE
        ts0 = self.tokens.timestamp_begin

        def new_sequence(w: Window, sampling: SamplingParams, cut: bool) -> Sequence:
            mel = self._mel(wave, w)
            budget = opts.max_new_tokens or window_budget(w.duration)  # the scheduler clamps to the context
            budget += start.tokens if start is not None else 0
            # Greedy Whisper loops on music, noise and unknown languages ("t-t-t-..."); the guard ends such
            # a window early (timestamps count as one class, so advancing times still form a loop).
            guard = RepetitionGuard(None, min_span=WHISPER_LOOP_MIN_SPAN, canonical=lambda t: min(ts0, t))
            seq = Sequence(prompt_ids=list(prompt), max_new_tokens=budget, stop_token_ids=(self.tokens.eot,),
                           # kept for alignment: words, a cut at a word, a tail's words (dropped once unneeded)
                           mm_inputs={"mel": mel, "keep_encoder": bool(self.alignment_heads)},
                           logits_processor=self.rules,
                           sampling=sampling, stop_checker=guard, tag=w, admission_class=opts.admission_class,
                           inbox=inbox)
            if start is not None:
                seq.mm_state[FORCED_START] = start
            return seq

        def finalize(r: WindowResult) -> list[dict]:
            code = self._window_language(r).get("language", choice.code)
            by_char = code in CHARACTER_LANGUAGES and choice.task == "transcribe"
            segs = self.segments.of_window(r.window, r.seq, r.output_ids, duration, want_words, by_char)
            for seg in segs:
                if start is not None:
                    seg["language"] = code  # the language this window was decoded in
                if r.flag is not None:
                    seg["flags"] = [r.flag]
            return segs

        return WindowDecoder(self.engine, self.tokens, self.engine.tokenizer.decode, new_sequence, finalize,
                             speech, on_event, vad_confidence, self.segments.cut_at_word, self.segments.words_end,
                             temperatures=temperature_schedule(opts.temperature), keep_encoder=keep)

    def _diarize(self, wave: np.ndarray, speech: list[tuple[float, float]], segments: list[dict],
                 opts: TranscribeOptions, should_cancel: Callable[[], bool] | None = None
                 ) -> tuple[list[dict], list[dict]]:
        """Segments with speakers, and the diarization's own turns ``[{start, end, speaker}]`` (seconds;
        speakers are the segments' ids; turns of two speakers may overlap). The turns say who spoke when
        more precisely than segment edges, which follow Whisper's timestamps (docs/diarization.md).

        Raises:
            Canceled: ``should_cancel()`` returned True while the cascade ran.
        """
        from transcription.diarization import assign_speakers, diarize
        from transcription.whisper.align import MIN_WORD_S, keep_min_duration

        turns = diarize(wave, speech, num_speakers=opts.num_speakers, min_speakers=opts.min_speakers,
                        max_speakers=opts.max_speakers, device=self.cascade_device,
                        should_cancel=should_cancel, stage=self.speaker_stage)
        pieces = assign_speakers(segments, turns)
        for seg in pieces:  # a piece trimmed to its speaker's turns may have squeezed a word to nothing
            if seg.get("words"):
                keep_min_duration(seg["words"], MIN_WORD_S, seg["start"], seg["end"])
        return pieces, [{"start": t.start, "end": t.end, "speaker": t.speaker} for t in turns]

    def _multichannel(self, samples: np.ndarray, opts: TranscribeOptions, on_event: EventFn | None,
                      should_cancel: Callable[[], bool] | None) -> dict:
        # one speaker per channel: no cascade; the channels' text is not streamed (it would interleave)
        begin_stage(on_event, "transcription")
        results = [self._whisper(samples[ch], opts, None, False, should_cancel) for ch in range(samples.shape[0])]
        return merge_channels(self.model_name, results, samples.shape[1], SAMPLE_RATE)
