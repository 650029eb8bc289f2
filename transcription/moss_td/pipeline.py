"""The MOSS-TD family's pipeline: one sequence for the whole recording, streamed, with completeness checks;
speaker labels come from the model, and the VAD runs beside the decode to measure coverage."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from diarist.contract.options import TranscribeOptions
from diarist.contract.result import EngineMetrics
from engine.engine import Engine
from engine.models.mel import SAMPLE_RATE
from engine.request import EventInbox, FinishReason, Sequence
from engine.streaming import DeltaCoalescer, IncrementalDetokenizer
from transcription.audio import DecodedAudio, Frontend
from transcription.cancel import Canceled
from transcription.decode_quality import temperature_schedule
from transcription.errors import EngineError, Rejected
from transcription.language import LanguageChoice
from transcription.limits import WHISPER_MAX_DURATION_S
from transcription.moss_td.parser import MossStreamParser
from transcription.moss_td.resume import resume_after_loops
from transcription.moss_td.sections import fits, transcribe_sections
from transcription.moss_td.sequence import build_moss_sequence, clamp_segment, moss_guard, moss_result
from transcription.progress import EventFn, begin_stage
from transcription.speech import cascade_device, detect_speech, speaker_stage


class LiveSegments:
    """Turns the raw decoded text of one MOSS-TD sequence into events while it decodes: ``segment`` for each
    segment as soon as it is final (:class:`transcription.moss_td.parser.MossStreamParser`), and ``delta``
    with the growth of the transcript text (segment texts joined by spaces), never the raw
    ``[12.3][S01]`` markup.

    The final result is authoritative: :meth:`finish` sends the segments not sent live (after a loop-guard
    stop the repeated tail is cut, so a live segment of the loop may be absent from the result).
    """

    def __init__(self, on_event: EventFn | None, duration: float) -> None:
        self.on_event, self.duration = on_event, duration
        self.parser = MossStreamParser()
        self.sent_segments = 0
        self.shown = ""

    def _segment(self, seg: dict) -> None:
        seg = clamp_segment(seg, self.duration)
        self.on_event("segment", {"start": seg["start"], "end": seg.get("end"), "text": seg["text"],
                                  "speaker": seg.get("speaker")})
        self.sent_segments += 1

    def _text(self, segments: list[dict]) -> None:
        visible = " ".join(s["text"] for s in segments)
        if len(visible) > len(self.shown) and visible.startswith(self.shown):  # only ever append
            self.on_event("delta", {"text": visible[len(self.shown):]})
            self.shown = visible

    def feed(self, raw: str) -> None:
        """Raw decoded text (a coalesced delta)."""
        for seg in self.parser.feed(raw):
            self._segment(seg)
        self._text(self.parser.open_segments())

    def finish(self, segments: list[dict]) -> None:
        """The result's segments: the text not shown yet, then the segments not sent yet."""
        self._text(segments)
        for seg in segments[self.sent_segments:]:
            self._segment(seg)


def transcribe_moss(engine: Engine, wave: np.ndarray, options: Any, on_event: EventFn | None,
                    should_cancel: Callable[[], bool] | None = None, fixed_output_tokens: int | None = None) -> dict:
    """Run one MOSS-TD sequence over ``wave`` (float32 ``[n]`` 16 kHz) and return the engine result dict.

    Text streams through an incremental detokenizer and a 50 ms coalescer into :class:`LiveSegments`:
    ``segment`` events as segments complete, ``delta`` events with the clean transcript text; nothing is
    streamed while the prompt is in (chunked) prefill, since tokens only exist after it. After a loop stop the
    decoding resumes from the last complete segment (``transcription.moss_td.resume``); the continuation is not
    streamed live, its segments are sent at the end (the result is authoritative). ``should_cancel`` is
    checked before the sequence is submitted (already canceled: nothing reaches the engine, finish_reason
    ``abort``) and polled while it runs (its KV is freed at once). ``fixed_output_tokens`` (benchmarks on
    dummy weights only, see :class:`transcription.transcriber.Transcriber`): decode exactly that many tokens
    (clamped to the context left), EOS and the loop guard off.

    A recording whose prompt would not leave room for its output runs as sections
    (:func:`transcription.moss_td.sections.transcribe_sections`).

    Raises:
        RequestRejected: ``too_short``, ``too_long``, ``kv_capacity`` (see :func:`build_moss_sequence`).
        EngineError: the sequence failed inside the engine.
    """
    duration = len(wave) / SAMPLE_RATE
    if should_cancel is not None and should_cancel():  # canceled before it started: build and submit nothing
        zeros = dict.fromkeys(("queue_wait_s", "encoder_s", "prefill_s", "decode_s", "vad_s", "diarization_s"),
                              0.0)
        return {"duration": duration, "segments": [], "finish_reason": FinishReason.ABORT.value,
                "coverage": 0.0, "no_speech": False, "repetition": None,
                "metrics": {**zeros, "prompt_tokens": 0, "output_tokens": 0}}
    if fixed_output_tokens is None and not fits(engine, len(wave), getattr(options, "prompt", None)):
        return transcribe_sections(engine, wave, options, on_event, should_cancel)
    budget = fixed_output_tokens or getattr(options, "max_new_tokens", None)
    temperatures = temperature_schedule(getattr(options, "temperature", None))
    seq = build_moss_sequence(engine, wave, budget, getattr(options, "prompt", None), temperatures[0])
    seq.admission_class = getattr(options, "admission_class", "default")
    if fixed_output_tokens is not None:
        seq.ignore_eos, seq.stop_checker = True, None
    detok = IncrementalDetokenizer(engine.tokenizer.decode, keep=lambda t: t not in seq.stop_token_ids)
    coalescer = DeltaCoalescer(engine.config.stream_interval_s)
    live = LiveSegments(on_event, duration)
    lock = threading.Lock()
    started = [False]

    def listener(s: Sequence, kind: str, payload: Any) -> None:
        if on_event is None:
            return
        with lock:
            if kind == "token":
                if not started[0]:
                    started[0] = True
                    on_event("started", {})
                out = coalescer.push(detok.push(payload))
                if out:
                    live.feed(out)
            elif kind == "finished":
                out = coalescer.push(detok.flush())
                rest = coalescer.flush() or out
                if rest:
                    live.feed(rest)

    # the listener runs on this thread, not the loop's; tokens reach it in batches of the delta coalescing window
    seq.on_event, seq.inbox = listener, EventInbox(batch_s=engine.config.stream_interval_s)
    engine.submit(seq)
    engine.run_until_done([seq], should_cancel=should_cancel)
    resumed = None
    if seq.finish_reason == FinishReason.REPETITION and fixed_output_tokens is None:
        resumed = resume_after_loops(engine, seq, wave, lambda: moss_guard(engine.tokenizer, duration),
                                     should_cancel, temperatures=temperatures[1:])
    errors = [s for s in (resumed.sequences if resumed else [seq]) if s.finish_reason == FinishReason.ERROR]
    if errors:
        raise EngineError(errors[0].error or "engine step failed")
    res = moss_result(seq, engine.tokenizer, duration, resumed)
    if on_event:
        live.finish(res["segments"])
    seqs = resumed.sequences if resumed else [seq]
    # the engine's metrics by their contract names (stage times summed: resumes run one after the other)
    metrics = {**EngineMetrics(queue_wait_s=seq.timings.queue_wait_s, prompt_tokens=res["prompt_tokens"],
                               output_tokens=res["output_tokens"],
                               **{k: sum(getattr(s.timings, k) for s in seqs)
                                  for k in ("encoder_s", "prefill_s", "decode_s")}).to_json(),
               "vad_s": 0.0, "diarization_s": 0.0, "resumes": resumed.resumes if resumed else 0}
    segments = [{**s, "end": s["end"] if s.get("end") is not None else s["start"]} for s in res["segments"]]
    out = {"duration": duration, "segments": segments, "finish_reason": res["finish_reason"],
           "coverage": res["coverage"], "no_speech": not segments, "metrics": metrics,
           "repetition": res.get("repetition"), "marker_interval_s": seq.mm_state.get("marker_interval_s"),
           "parse_issues": res["parse_issues"]}
    if resumed is not None and resumed.resumes and res["finish_reason"] == FinishReason.REPETITION.value:
        out["incomplete_reason"] = (f"decoding still looped after {resumed.resumes} resume(s) from the last "
                                    f"complete segment ({res['repetition']})")
    return out


class MossTdPipeline:
    """A :class:`transcription.pipeline.FamilyPipeline` for MOSS-TD (one per engine; safe to call from many
    threads at once). It transcribes only (no translate task) and takes any language: a requested one is
    reported as such, none is detected. ``fixed_output_tokens``: see :func:`transcribe_moss`."""

    family = "moss-td"  # engine.loaded.info["family"] of the engines it serves
    frontend = Frontend.for_family(family)
    # No bound of the model's own here: the engine checks each prompt (``too_long``) and a recording longer
    # than one prompt holds runs as sections; the cap on what a decoded recording may hold stays the one
    # the service has always applied to every family (the API's own, smaller one: transcription.limits).
    max_duration_s = WHISPER_MAX_DURATION_S
    bound_holder = "the MOSS-TD pipeline"
    takes_fixed_output_tokens = True

    def __init__(self, engine: Engine, model_name: str | None, fixed_output_tokens: int | None = None) -> None:
        self.engine, self.model_name = engine, model_name
        self.fixed_output_tokens = fixed_output_tokens
        self.cascade_device = cascade_device(engine)
        self.speaker_stage = speaker_stage(self.cascade_device)  # the VAD's segmentation pass, batched on CUDA

    def check(self, opts: TranscribeOptions) -> None:
        """Refuse a task other than ``transcribe`` (``Rejected`` ``unsupported_task``)."""
        if opts.task != "transcribe":
            raise Rejected("unsupported_task", f"{self.model_name} only transcribes; task={opts.task!r} was asked for")

    def transcribe(self, audio: DecodedAudio, opts: TranscribeOptions, on_event: EventFn | None,
                   should_cancel: Callable[[], bool] | None) -> dict:
        """The engine result dict of ``audio``'s mono mix (:func:`transcribe_moss`) with the model, the
        language fields and the detected speech, before :func:`transcription.result.finish_result`."""
        # Coverage compares the transcript with detected speech: the VAD runs beside the engine's decode
        # (torch and ONNX release the interpreter lock), not after it; the stage clients see is the model's.
        begin_stage(on_event, "transcription")
        with ThreadPoolExecutor(1, thread_name_prefix="diarist-vad") as pool:
            t_vad = time.perf_counter()
            segmenter = None if self.speaker_stage is None else self.speaker_stage.segment
            vad = pool.submit(lambda: (detect_speech(audio.mono, self.cascade_device, should_cancel, segmenter)[0],
                                       time.perf_counter() - t_vad))
            result = transcribe_moss(self.engine, audio.mono, opts, on_event, should_cancel,
                                     fixed_output_tokens=self.fixed_output_tokens)
            try:
                speech, vad_s = vad.result()
            except Canceled:  # the VAD stopped between its blocks: the caller wants no result
                speech = vad_s = None
        result["model"] = self.model_name
        # what the engine assumed at load (no marker interval stated by the folder) goes with every result
        result["warnings"] = [*(dict(w) for w in self.engine.loaded.info.get("result_warnings", [])),
                              *result.get("warnings", [])]
        result.update(LanguageChoice(opts.language, "requested" if opts.language else None).result_fields())
        result["family"] = self.family
        if result["finish_reason"] != FinishReason.ABORT.value and speech is not None:
            result["speech"] = [[s, e] for s, e in speech]
            result["metrics"]["vad_s"] = vad_s
        return result
