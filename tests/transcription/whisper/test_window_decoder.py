"""The window decoder's rules on a scripted Whisper: fallback, resume after a loop, seams, silence, flags.

The scripted model "hears" a recording of numbered words (word ``k`` spans ``[0.5 k, 0.5 k + 0.4]`` s) and
answers a window the way tiny.en does, timestamps and all: segments of four words, and the faults the
issue reports: words in the last seconds before a cut inside speech are dropped (the model closes its
segment and stops), and a loop ("loop loop loop ...") where the test asks for one. The real loop guard, stop
rules and quality checks run on its tokens.
"""

from __future__ import annotations

import random
import string

import pytest

from engine.request import FinishReason, Sequence, Status, stop_reason
from engine.sampling import SamplingParams
from transcription.decode_quality import FALLBACK_SEED, LOOP, LOW_CONFIDENCE, TEMPERATURES
from transcription.repetition import RepetitionGuard
from transcription.whisper.decoding import TIME_PRECISION, WhisperTokens, split_segments
from transcription.whisper.window_decoder import MAX_RESUMES, WindowDecoder, WindowResult
from transcription.whisper.window_outcome import (
    FAILED_WINDOWS,
    MAYBE_NOT_ENGLISH,
    incomplete_reason,
    window_finish,
    window_metrics,
    window_warnings,
)
from transcription.whisper.windows import Window, pack_windows

T = WhisperTokens()
WORD0 = 1000  # token of word k: WORD0 + k
LOOP_TOKEN = 999


def word_span(k: int) -> tuple[float, float]:
    return 0.5 * k, 0.5 * k + 0.4


def ts(seconds: float) -> int:
    return T.timestamp_begin + round(seconds / TIME_PRECISION)


class Script:
    """What the scripted model outputs for a window, and with which confidence."""

    def __init__(self, n_words: int, loop=None, logprob: float = -0.2, no_speech: float = 0.01,
                 drop_before_cut_s: float = 3.0, early_eot_s: float = 0.0, early_close_s: float = 0.0) -> None:
        self.n_words = n_words
        self.early_close_s = early_close_s  # the last segment's closing timestamp comes this early (words all said)
        self.early_eot_s = early_eot_s  # windows over 10 s end their text this early, cut or not
        self.loop = loop  # (window, temperature) -> index into the window's words where a loop starts, or None
        self.logprob = logprob
        self.no_speech = no_speech
        self.drop = drop_before_cut_s

    def tokens(self, w: Window, temperature: float, cut: bool) -> list[int]:
        words = [k for k in range(self.n_words) if word_span(k)[0] >= w.start - 1e-9 and word_span(k)[1] <= w.end]
        if cut:  # the fault at a hard cut: the last seconds' words never come out
            words = [k for k in words if word_span(k)[1] <= w.end - self.drop]
        if self.early_eot_s and w.duration > 10.0:  # end-of-text with speech left in the window
            words = [k for k in words if word_span(k)[1] <= w.end - self.early_eot_s]
        loop_at = self.loop(w, temperature) if self.loop else None
        out: list[int] = []
        for i in range(0, len(words), 4):
            group = words[i : i + 4]
            if loop_at is not None and i + 4 > loop_at:
                head = [k for k in group if words.index(k) < loop_at]
                out += [ts(word_span(group[0])[0] - w.start)] + [WORD0 + k for k in head]
                return out + [LOOP_TOKEN] * 400  # no closing timestamp: the loop runs to the budget
            close = word_span(group[-1])[1] - w.start
            if i + 4 >= len(words):
                close = max(word_span(group[0])[0] - w.start, close - self.early_close_s)
            out += [ts(word_span(group[0])[0] - w.start), *(WORD0 + k for k in group), ts(close)]
        return out + [T.eot]


class FakeEngine:
    """Runs each submitted sequence to its end at once with the engine's own stop rules."""

    def __init__(self, script: Script, speech: list[tuple[float, float]]) -> None:
        self.script = script
        self.speech = speech
        self.submitted: list[Sequence] = []

    def _cut(self, w: Window) -> bool:
        return any(s < w.end - 1e-6 and e > w.end + 1e-6 for s, e in self.speech)

    def submit(self, seq: Sequence) -> None:
        w = seq.tag
        self.submitted.append(seq)
        seq.mm_state["no_speech_prob"] = self.script.no_speech
        for tok in self.script.tokens(w, seq.sampling.temperature, self._cut(w)):
            seq.output_ids.append(tok)
            seq.output_logprobs.append(self.script.logprob)
            reason = stop_reason(seq, tok)
            if reason is not None:
                seq.finish_reason, seq.status = reason, Status.FINISHED
                return
        raise AssertionError("script ended without a stop")

    def run_until_any_done(self, seqs, timeout_s=None, should_cancel=None):
        return [s for s in seqs if s.finished]

    def run_until_done(self, seqs, timeout_s=None, should_cancel=None):
        return seqs

    def abort(self, seq):  # pragma: no cover - nothing is ever left running
        raise AssertionError("no abort expected")


def word(k: int) -> str:
    """Word ``k``'s spelling: letters drawn from ``k`` (a numbered vocabulary would compress like a loop)."""
    rng = random.Random(k)
    return "".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(3, 8)))


def decode_ids(ids: list[int]) -> str:
    return " ".join("loop" if t == LOOP_TOKEN else word(t - WORD0) for t in ids if t < T.eot)


def aligned_end(seq: Sequence, ids: list[int], w: Window) -> float | None:
    """The scripted alignment: where the last word of ``ids`` really ends, seconds into ``w``."""
    said = [t - WORD0 for t in ids if WORD0 <= t < T.eot]
    return word_span(said[-1])[1] - w.start if said else None


def run(script: Script, speech: list[tuple[float, float]], events=None, words_end=None):
    eng = FakeEngine(script, speech)

    def new_sequence(w: Window, sampling: SamplingParams, cut: bool) -> Sequence:
        guard = RepetitionGuard(None, min_span=48, canonical=lambda t: min(T.timestamp_begin, t))
        return Sequence(prompt_ids=[T.sot], max_new_tokens=max(64, int(10 * w.duration)),
                        stop_token_ids=(T.eot,), sampling=sampling, stop_checker=guard, tag=w)

    def finalize(r: WindowResult) -> list[dict]:
        return [{"start": r.window.start + x.start, "end": r.window.start + x.end, "text": decode_ids(x.token_ids)}
                for x in split_segments(T, r.output_ids, r.window.duration)]

    dec = WindowDecoder(eng, T, decode_ids, new_sequence, finalize, speech,
                        on_event=(lambda k, p: events.append((k, p))) if events is not None else None,
                        words_end=words_end)
    results = dec.run(pack_windows(speech))
    words = " ".join(s["text"] for r in results for s in r.segments).split()
    return dec, results, words, eng


def every_word(n: int) -> list[str]:
    return [word(k) for k in range(n)]


def test_speech_through_hard_cuts_keeps_every_word_once():
    n = 150  # 75 s of speech without a pause: cuts at 30 s and later
    dec, results, words, _ = run(Script(n), [(0.0, 75.0)])
    assert words == every_word(n)
    assert len(results) >= 3 and all(r.status == "ok" for r in results)
    assert window_metrics(results, dec.sequences)["windows_refed"] >= 2
    assert all(r.window.duration <= 30.0 + 1e-9 for r in results)


def test_without_the_seam_rule_the_cut_loses_words():
    """The scripted fault is real: a window cut inside speech drops its last seconds' words."""
    script = Script(80)
    toks = script.tokens(Window(0.0, 30.0), 0.0, cut=True)
    heard = {t - WORD0 for t in toks if WORD0 <= t < WORD0 + 80}
    assert heard == set(range(54))  # words 54..59 (27-30 s) are missing from that window


def test_speech_after_an_early_end_of_text_is_decoded_again():
    n = 56  # 28 s in one window that ends at a silence; the model stops 5 s early
    _, results, words, _ = run(Script(n, early_eot_s=5.0), [(0.0, 28.0)])
    assert words == every_word(n)
    assert results[0].end < results[0].window.end and results[1].window.start == results[0].end


def test_a_tail_the_words_already_cover_is_not_decoded_again():
    """The last segment closes 3 s before its words end (base on meeting speech): the speech after the
    closing timestamp is the text's own last words, and decoding it again wrote them twice."""
    n = 56  # 28 s in one window that ends at a silence
    _, results, words, _ = run(Script(n, early_close_s=3.0), [(0.0, 28.0)], words_end=aligned_end)
    assert words == every_word(n)  # each word once
    assert len(results) == 1 and results[0].end == results[0].window.end


def test_a_tail_is_decoded_again_from_where_the_words_end():
    """Early end-of-text after an early close: the re-decode starts after the last word, not at the early
    timestamp, so no word is written twice and none is lost."""
    n = 56
    _, results, words, _ = run(Script(n, early_eot_s=5.0, early_close_s=2.0), [(0.0, 28.0)], words_end=aligned_end)
    assert words == every_word(n)
    assert results[1].window.start == pytest.approx(results[0].end)
    assert results[0].end > results[0].window.start + 22.0  # the words' end (22.9 s), not the close (20.9 s)


def test_a_greedy_loop_is_recovered_by_the_next_temperature():
    n = 40
    _, results, words, eng = run(Script(n, loop=lambda w, temp: 6 if temp == 0.0 else None), [(0.0, 20.0)])
    assert words == every_word(n)
    (r,) = results
    assert r.status == "ok" and r.attempts == 2 and r.quality.temperature == TEMPERATURES[1]
    assert [s.sampling for s in eng.submitted] == [
        SamplingParams(temperature=t, seed=FALLBACK_SEED, logprobs=True) for t in TEMPERATURES[:2]]
    assert window_finish(results, False) == FinishReason.STOP and incomplete_reason(results) is None


def test_a_loop_at_every_temperature_resumes_after_the_last_good_segment():
    n = 40
    first = Window(0.0, 20.0)  # the recording's window loops at word 10 whatever the temperature
    _, results, words, _ = run(Script(n, loop=lambda w, temp: 10 if w == first else None), [(0.0, 20.0)])
    assert words == every_word(n)
    assert results[0].window == first and results[0].attempts == len(TEMPERATURES)
    assert results[0].end == pytest.approx(word_span(7)[1])  # text kept up to its last complete segment
    assert results[1].window.start == pytest.approx(word_span(7)[1]) and results[1].status == "ok"
    assert window_finish(results, False) == FinishReason.STOP and incomplete_reason(results) is None


def test_a_window_that_always_loops_is_flagged_and_the_transcript_incomplete():
    n = 40  # every window loops after its first segment, at every temperature
    _, results, words, _ = run(Script(n, loop=lambda w, temp: 6), [(0.0, 20.0)])
    failed = [r for r in results if r.status == "failed"]
    assert len(failed) == 1 and failed[0].flag == LOOP and failed[0] is results[-1]
    assert len(results) == MAX_RESUMES + 1  # each resume kept its first segment, then it gave up
    assert all(s["text"] for r in failed for s in r.segments)  # its best text is kept, not dropped
    assert window_finish(results, False) == FinishReason.REPETITION
    reason = incomplete_reason(results)
    assert reason and "looped" in reason and f"{failed[0].window.start:.1f}" in reason
    assert words[: 4 * (MAX_RESUMES + 1)] == every_word(4 * (MAX_RESUMES + 1))  # nothing before it lost


def test_a_loop_before_any_complete_segment_gives_the_window_up_at_once():
    _, results, words, _ = run(Script(40, loop=lambda w, temp: 2), [(0.0, 20.0)])
    (r,) = results
    assert r.status == "failed" and r.flag == LOOP and r.attempts == len(TEMPERATURES)
    assert words[:2] == every_word(2)  # the words before the loop stay


def test_silence_by_the_model_and_the_vad_keeps_no_text():
    _, results, words, _ = run(Script(20, logprob=-1.5, no_speech=0.9), [(0.0, 10.0)])
    assert words == [] and results[0].status == "no_speech" and results[0].attempts == 1


def test_low_confidence_everywhere_keeps_the_text_flags_it_and_makes_the_transcript_incomplete():
    _, results, words, _ = run(Script(20, logprob=-1.5, no_speech=0.1), [(0.0, 10.0)])
    (r,) = results
    assert words == every_word(20)
    assert r.status == "failed" and r.flag == LOW_CONFIDENCE and r.attempts == len(TEMPERATURES)
    assert window_finish(results, False) == FinishReason.STOP  # nothing was cut: the text is doubtful
    reason = incomplete_reason(results)
    assert reason and "every decode attempt failed" in reason and "0.0-10.0 s" in reason
    assert [w["code"] for w in window_warnings(results, english_only=False)] == [FAILED_WINDOWS]
    warned = window_warnings(results, english_only=True)
    assert [w["code"] for w in warned] == [FAILED_WINDOWS, MAYBE_NOT_ENGLISH]
    assert all(w["count"] == 1 for w in warned) and "English" in warned[1]["message"]


def test_windows_that_passed_give_no_failure_warning():
    _, results, _, _ = run(Script(20), [(0.0, 10.0)])
    assert incomplete_reason(results) is None and window_warnings(results, english_only=True) == []


def test_events_arrive_in_time_order_and_spell_the_transcript():
    events: list = []
    n = 150
    _, results, words, _ = run(Script(n, loop=lambda w, temp: 5 if (w.start < 1 and temp == 0) else None),
                                 [(0.0, 40.0), (41.0, 75.0)], events)
    starts = [p["start"] for k, p in events if k == "segment"]
    assert starts == sorted(starts) and len(starts) == sum(len(r.segments) for r in results)
    assert " ".join("".join(p["text"] for k, p in events if k == "delta").split()) == " ".join(words)


def test_a_requested_temperature_starts_the_fallback_ladder():
    """OpenAI's ``temperature`` is the first attempt's, the ladder goes on 0.2 hotter from there, as
    openai-whisper's ``--temperature`` (issue 33 item 7)."""
    from transcription.decode_quality import temperature_schedule

    assert temperature_schedule() == TEMPERATURES == temperature_schedule(0) == (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)
    assert temperature_schedule(0.3) == (0.3, 0.5, 0.7, 0.9) and temperature_schedule(1.0) == (1.0,)
    with pytest.raises(ValueError, match="between 0 and 1"):
        temperature_schedule(1.2)
    n = 40
    eng = FakeEngine(Script(n, loop=lambda w, temp: 6 if temp < 0.5 else None), [(0.0, 20.0)])
    dec = WindowDecoder(eng, T, decode_ids, lambda w, sampling, cut: Sequence(
        prompt_ids=[T.sot], max_new_tokens=200, stop_token_ids=(T.eot,), sampling=sampling,
        stop_checker=RepetitionGuard(None, min_span=48, canonical=lambda t: min(T.timestamp_begin, t)), tag=w),
        lambda r: [{"start": r.window.start + x.start, "end": r.window.start + x.end,
                    "text": decode_ids(x.token_ids)} for x in split_segments(T, r.output_ids, r.window.duration)],
        [(0.0, 20.0)], temperatures=temperature_schedule(0.4))
    (r,) = dec.run(pack_windows([(0.0, 20.0)]))
    assert [s.sampling.temperature for s in eng.submitted] == [0.4, 0.6]
    assert r.status == "ok" and r.quality.temperature == 0.6
