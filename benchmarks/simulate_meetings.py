"""Simulated meetings: a development set for the speaker cascade that can grow, with exact references.

Each meeting mixes utterances of 2 to 6 talkers into one 16 kHz mono track, with a controlled share of
overlapped speech, and writes it in the ``diarist eval`` layout (one folder per meeting:
``<name>.wav``, ``<name>.rttm``, ``<name>.stm`` when every utterance has a known text), plus
``manifest.json`` (the talkers, the overlap reached, the command). Everything follows from ``--seed``:
the same seed and options give the same bytes.

Talkers (none of them a talker of the VALIDATION items of the shared data: the AMI meeting excerpts, the
phone call and the stereo overlap are never read here, see ``VALIDATION_PREFIXES``):

- real single-speaker clips of the shared data (``REAL_TALKERS``: LibriSpeech, JFK, LJSpeech, TIMIT,
  the AMI headset clip, the English/German reader, zh/ja clips); a talker's utterances are its whole
  clips (with their text) or, for the long reader, seeded 2-7 s spans (no text);
- espeak-ng voices (``espeak-ng -v <language>+<variant> -p <pitch> -s <speed>``): each synthetic talker is
  one (language, variant, pitch, speed) tuple drawn from the seed, saying sentences from a seeded
  word grammar (so its text is known).

A meeting: ``n`` talkers (``--talkers`` cycles through 2..6 so each count is equally represented), a
target overlap ratio drawn in ``[0, --max-overlap]``, a duration drawn in ``--duration``. Turns are drawn
with no immediate repeat of a talker (every talker speaks in the first ``n`` turns); between two turns
comes a pause (0.1-1.2 s) or, where the schedule asks, an overlap: the next turn starts before the
previous ends. The overlap lengths are ``k * u_i`` (``u_i`` seeded, each capped at 80% of the shorter of the
two turns) and ``k`` is set by bisection so that the overlapped share of speech (time with two or more
talkers / time with at least one, as in the RTTM) is the target. Levels: each talker's gain in
``--gain-db`` (default -6..0 dB), a white noise floor at ``--noise-dbfs`` (default -55), the mix
peak-normalised to -3 dBFS; ``--reverb`` puts each talker in a synthetic room (:func:`room`).

RTTM turns are the utterances' speech spans (each utterance trimmed of leading/trailing silence, so a
turn starts and ends with speech; pauses inside one utterance belong to its turn, as in hand-made
references).

Run (the output folder must be outside the repository; the audio is never committed):
    PYTHONPATH=. python benchmarks/simulate_meetings.py /work/tmp/simset --count 40 --seed 0
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import shlex
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

SAMPLE_RATE = 16000
"""Output rate (Hz); the cascade's own rate (``transcription.audio.SAMPLE_RATE``)."""

VALIDATION_PREFIXES = ("en_ami_meeting_", "en_2spk_phonecall", "en_stereo_2spk")
"""Shared-data folders that are the validation set: never mixed, never read by this script."""

REAL_TALKERS: dict[str, list[str]] = {
    # talker -> its single-speaker clips (paths under the data folder); one talker per real voice
    "jfk": ["en_jfk_inaugural/jfk.flac"],
    "ls1995": ["en_librispeech_1995-1837-0001/librispeech-1995-1837-0001.wav"],
    "ls1272": ["en_librispeech_1272-128104-0000_picovoice/test.wav"],
    "lj": ["en_ljspeech_LJ002-0020_22k/LJ002-0020.wav"],
    "timit": ["en_timit_LDC93S1_16k_8k_44k-stereo/LDC93S1.wav"],
    "fee041": ["en_ami_headset_ES2011a_40-46s/ES2011a.Headset-0-40s-46s.wav"],
    "reader": ["multi_en_de_codeswitch_mp3_fasterwhisper/multilingual.mp3"],
    "aishell1": ["zh_aishell1_BAC009S0724W0121/aishell-BAC009S0724W0121.wav"],
    "funasr": ["zh_funasr_asr_example/asr_example.wav"],
    "ja": ["ja_picovoice_test_ja/test_ja.wav"],
}
SPAN_TALKERS = {"reader"}
"""Talkers whose one long clip is cut into seeded spans (no text) instead of used whole."""

ESPEAK_LANGUAGES = ("en-us", "en", "en-gb-scotland", "en-gb-x-rp", "en-029", "en-gb-x-gbclan")
ESPEAK_VARIANTS = ("m1", "m2", "m3", "m4", "m5", "m6", "m7", "f1", "f2", "f3", "f4", "f5", "klatt", "klatt2",
                   "klatt3", "croak", "whisperf", "Alex", "Andy", "Annie", "benjamin", "david", "ed", "edward",
                   "john", "linda", "max", "michel", "norbert", "quincy", "rob", "robert", "steph", "travis")

_WORDS = {
    "subj": ["we", "the team", "our client", "the manager", "everyone", "the design group", "marketing", "the new intern", "my colleague", "the board"],
    "verb": ["should review", "can finish", "will present", "needs to check", "decided to move", "wants to discuss", "might delay", "has approved", "forgot about", "is testing"],
    "obj": ["the budget", "the remote control", "the schedule", "the prototype", "the report", "the slides", "the user study", "the battery design", "the next meeting", "the price target", "the colour scheme", "the survey"],
    "tail": ["before friday", "this afternoon", "by the end of the month", "after lunch", "next week", "as soon as possible", "with the engineers", "without any changes", "for the second time", "in the evening"],
    "short": ["yes exactly", "no I do not think so", "right", "okay sure", "that makes sense", "hmm maybe", "good point", "I agree with that", "wait a second", "sounds good to me"],
}


@dataclass
class Utterance:
    """One utterance: 16 kHz float32 samples trimmed to speech, and its text (``None`` when unknown)."""

    samples: np.ndarray
    text: str | None


@dataclass
class Talker:
    """A talker identity (``name``) and how to make its utterances (``kind``: ``real`` or ``espeak``)."""

    name: str
    kind: str
    spec: dict = field(default_factory=dict)


@dataclass
class Turn:
    """One placed utterance: talker, start (s) and the utterance."""

    talker: str
    start: float
    utt: Utterance

    @property
    def end(self) -> float:
        return self.start + self.utt.samples.size / SAMPLE_RATE


def trim(x: np.ndarray, floor_db: float = -40.0, hop: int = 160) -> np.ndarray:
    """``x`` without leading/trailing frames (10 ms) quieter than ``floor_db`` below its loudest frame."""
    n = x.size // hop
    if n == 0:
        return x
    e = 10 * np.log10(np.mean(x[: n * hop].reshape(n, hop) ** 2, axis=1) + 1e-12)
    keep = np.flatnonzero(e > e.max() + floor_db)
    return x[keep[0] * hop: (keep[-1] + 1) * hop] if keep.size else x[:0]


def sentence(rng: np.random.Generator) -> str:
    """A seeded sentence of the meeting grammar (short reply or subject-verb-object[-tail])."""
    def pick(k: str) -> str:
        return _WORDS[k][rng.integers(len(_WORDS[k]))]

    if rng.random() < 0.25:
        return pick("short")
    s = f"{pick('subj')} {pick('verb')} {pick('obj')}"
    return s + (f" {pick('tail')}" if rng.random() < 0.6 else "")


def espeak(text: str, voice: str, pitch: int, speed: int, cache: Path) -> np.ndarray:
    """``text`` said by espeak-ng (``-v voice -p pitch -s speed``) at 16 kHz float32, trimmed; cached by hash.

    Raises ``RuntimeError`` when espeak-ng is missing or fails."""
    key = hashlib.sha1(f"{voice}|{pitch}|{speed}|{text}".encode()).hexdigest()[:16]
    path = cache / f"{key}.npy"
    if path.is_file():
        return np.load(path)
    with tempfile.NamedTemporaryFile(suffix=".wav") as f:
        cmd = ["espeak-ng", "-v", voice, "-p", str(pitch), "-s", str(speed), "-w", f.name, text]
        try:
            subprocess.run(cmd, check=True, capture_output=True)
        except (OSError, subprocess.CalledProcessError) as e:
            raise RuntimeError(f"espeak-ng failed ({shlex.join(cmd)}): {e}") from e
        x = _decode(f.name)
    x = trim(x)
    cache.mkdir(parents=True, exist_ok=True)
    np.save(path, x)
    return x


def _decode(path: str | Path) -> np.ndarray:
    from transcription.audio import decode_audio

    return decode_audio(str(path)).samples[0].astype(np.float32)


def real_utterances(talker: str, data: Path) -> list[Utterance]:
    """Every utterance a real talker can contribute (whole clips with their text; spans for SPAN_TALKERS)."""
    out = []
    for rel in REAL_TALKERS[talker]:
        if rel.startswith(VALIDATION_PREFIXES):
            raise ValueError(f"{rel} is a validation item and must not be mixed")
        x = trim(_decode(data / rel))
        if talker in SPAN_TALKERS:
            hop = 4 * SAMPLE_RATE  # spans are cut at meeting time; here the clip in 4 s pieces
            out += [Utterance(trim(x[i: i + hop]), None) for i in range(0, x.size - hop // 2, hop)]
            continue
        txt = (data / rel).with_suffix(".txt")
        out.append(Utterance(x, txt.read_text().strip() if txt.is_file() else None))
    return out


def talker_pool(rng: np.random.Generator, data: Path | None, n_espeak: int) -> list[Talker]:
    """The talkers a set draws from: the real ones present under ``data`` and ``n_espeak`` distinct
    espeak-ng identities (language, variant, pitch 20-80, speed 140-190 wpm) drawn from ``rng``."""
    pool = []
    if data is not None:
        pool += [Talker(t, "real") for t, files in REAL_TALKERS.items() if all((data / f).is_file() for f in files)]
    seen = set()
    while len(seen) < n_espeak:
        lang = ESPEAK_LANGUAGES[rng.integers(len(ESPEAK_LANGUAGES))]
        var = ESPEAK_VARIANTS[rng.integers(len(ESPEAK_VARIANTS))]
        if (lang, var) in seen:
            continue
        seen.add((lang, var))
        pool.append(Talker(f"es_{lang}_{var}", "espeak", {"voice": f"{lang}+{var}", "pitch": int(rng.integers(20, 81)),
                                                          "speed": int(rng.integers(140, 191))}))
    return pool


class Voices:
    """Makes utterances of the pool's talkers (real clips loaded once, espeak-ng calls cached)."""

    def __init__(self, data: Path | None, cache: Path):
        self.data, self.cache, self._real = data, cache, {}

    def utterance(self, t: Talker, rng: np.random.Generator) -> Utterance:
        if t.kind == "espeak":
            text = sentence(rng)
            return Utterance(espeak(text, t.spec["voice"], t.spec["pitch"], t.spec["speed"], self.cache), text)
        if t.name not in self._real:
            self._real[t.name] = real_utterances(t.name, self.data)
        utts = self._real[t.name]
        u = utts[rng.integers(len(utts))]
        if t.name in SPAN_TALKERS:  # a 2-7 s span of the piece
            n = min(u.samples.size, int(rng.uniform(2, 7) * SAMPLE_RATE))
            a = int(rng.integers(0, u.samples.size - n + 1))
            return Utterance(trim(u.samples[a: a + n]), None)
        return u


def overlap_ratio(turns: list[tuple[str, float, float]]) -> float:
    """Time with >= 2 talkers / time with >= 1 talker, from ``(talker, start, end)`` turns (seconds)."""
    edges = sorted({t for _, s, e in turns for t in (s, e)})
    one = two = 0.0
    for a, b in itertools.pairwise(edges):
        n = sum(s < b and e > a for _, s, e in turns)
        one += (b - a) * (n >= 1)
        two += (b - a) * (n >= 2)
    return two / one if one else 0.0


def schedule(utts: list[tuple[str, Utterance]], pauses: np.ndarray, u: np.ndarray, overlapping: np.ndarray,
             target: float) -> list[Turn]:
    """Place the utterances one after the other; turn ``i`` starts ``pauses[i]`` after turn ``i-1`` ends, or,
    where ``overlapping[i]``, ``min(k*u[i], 0.8*shorter)`` before it ends, with ``k`` bisected so that
    :func:`overlap_ratio` reaches ``target`` (as close as the caps allow)."""

    def place(k: float) -> list[Turn]:
        out, t = [], 0.5
        for i, (name, utt) in enumerate(utts):
            dur = utt.samples.size / SAMPLE_RATE
            if i:
                prev = out[-1]
                prev_dur = prev.end - prev.start
                if overlapping[i]:
                    t = max(prev.start + 0.2 * prev_dur, prev.end - min(k * u[i], 0.8 * min(dur, prev_dur)))
                else:
                    t = max(t, prev.end) + pauses[i]
            out.append(Turn(name, t, utt))
            t = out[-1].end
        return out

    def ratio(k: float) -> float:
        return overlap_ratio([(x.talker, x.start, x.end) for x in place(k)])

    if target <= 0 or not overlapping.any():
        return place(0.0)
    lo, hi = 0.0, 1.0
    while ratio(hi) < target and hi < 64:
        hi *= 2
    for _ in range(30):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if ratio(mid) < target else (lo, mid)
    return place(hi)


def merged_turns(turns: list[Turn], gap: float = 0.0) -> list[tuple[str, float, float]]:
    """Per-talker speech spans (seconds), touching/overlapping spans of one talker merged."""
    out = []
    for name in sorted({t.talker for t in turns}):
        spans = sorted((t.start, t.end) for t in turns if t.talker == name)
        cur = list(spans[0])
        for s, e in spans[1:]:
            if s <= cur[1] + gap:
                cur[1] = max(cur[1], e)
            else:
                out.append((name, *cur))
                cur = [s, e]
        out.append((name, *cur))
    return sorted(out, key=lambda x: (x[1], x[0]))


def make_meeting(rng: np.random.Generator, pool: list[Talker], voices: Voices, n_talkers: int, target: float,
                 duration: float, gain_db: tuple[float, float] = (-6.0, 0.0), noise_dbfs: float = -55.0,
                 reverb: float = 0.0) -> tuple[np.ndarray, list[Turn], dict[str, np.ndarray]]:
    """One meeting: ``(mix [n] float32, turns, per-talker tracks {talker: [n] float32})``."""
    idx = rng.choice(len(pool), size=n_talkers, replace=False)
    talkers = [pool[i] for i in idx]
    order = list(rng.permutation(n_talkers))  # everyone speaks once first
    utts: list[tuple[str, Utterance]] = []
    total = 0.0
    while total < duration * 1.1 or len(utts) < 2 * n_talkers:
        if len(utts) < n_talkers:
            j = order[len(utts)]
        else:
            j = int(rng.integers(n_talkers - 1))
            prev = [t.name for t in talkers].index(utts[-1][0])
            j = j + (j >= prev)
        t = talkers[j]
        utt = voices.utterance(t, rng)
        if utt.samples.size < 0.3 * SAMPLE_RATE:
            continue
        utts.append((t.name, utt))
        total += utt.samples.size / SAMPLE_RATE
    n = len(utts)
    pauses = rng.uniform(0.1, 1.2, n)
    u = rng.uniform(0.3, 1.0, n)
    p_ov = min(0.95, 2.5 * target)  # more overlap asked -> more transitions overlap
    overlapping = (rng.random(n) < p_ov) & (np.arange(n) > 0)
    turns = schedule(utts, pauses, u, overlapping, target)
    turns = [t for t in turns if t.start < duration] or turns[:2]
    length = int(np.ceil((max(t.end for t in turns) + 0.5) * SAMPLE_RATE))
    gains = {t.name: 10 ** (rng.uniform(*gain_db) / 20) for t in talkers}
    tracks = {t.name: np.zeros(length, np.float32) for t in talkers if any(x.talker == t.name for x in turns)}
    for t in turns:
        x = t.utt.samples / max(1e-6, np.abs(t.utt.samples).max()) * 0.5 * gains[t.talker]
        a = round(t.start * SAMPLE_RATE)
        tracks[t.talker][a: a + x.size] += x.astype(np.float32)
    noise = rng.standard_normal(length).astype(np.float32) * 10 ** (noise_dbfs / 20)
    if reverb > 0:  # drawn after everything else, so reverb=0 leaves a meeting's bytes as they were
        tracks = {k: room(x, rng, reverb) for k, x in tracks.items()}
    mix = sum(tracks.values()) + noise
    scale = 10 ** (-3 / 20) / max(1e-6, float(np.abs(mix).max()))
    for k in tracks:
        tracks[k] *= scale
    return (mix * scale).astype(np.float32), turns, tracks


def room(x: np.ndarray, rng: np.random.Generator, rt60_max: float) -> np.ndarray:
    """``x`` heard in a room: convolved with a synthetic impulse response, a unit direct path plus
    exponentially decaying white noise (reverberation time drawn in ``[0.2, rt60_max]`` s, 60 dB of decay)
    whose energy is the direct path's times ``10 ** (-drr / 10)``, drr drawn in -6..+6 dB (a far talker
    is below 0 dB). Same length as ``x``."""
    from scipy.signal import fftconvolve

    rt60 = rng.uniform(0.2, max(0.2, rt60_max))
    drr_db = rng.uniform(-6.0, 6.0)
    t = np.arange(1, int(rt60 * SAMPLE_RATE)) / SAMPLE_RATE
    tail = rng.standard_normal(t.size) * np.exp(-6.9 * t / rt60)
    tail *= np.sqrt(10 ** (-drr_db / 10) / max(1e-12, float((tail ** 2).sum())))
    h = np.concatenate([[1.0], tail])
    return fftconvolve(x, h)[: x.size].astype(np.float32)


def write_wav(path: Path, x: np.ndarray) -> None:
    """16 kHz mono PCM16 WAV."""
    import wave

    pcm = np.clip(np.round(x * 32767), -32768, 32767).astype("<i2")
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(SAMPLE_RATE)
        w.writeframes(pcm.tobytes())


def rttm_lines(uri: str, turns: list[Turn]) -> list[str]:
    """Standard 10-field RTTM lines of the per-talker merged spans (3 decimals)."""
    return [f"SPEAKER {uri} 1 {s:.3f} {e - s:.3f} <NA> <NA> {name} <NA> <NA>"
            for name, s, e in merged_turns(turns)]


def stm_lines(uri: str, turns: list[Turn]) -> list[str] | None:
    """STM lines (one per utterance), or ``None`` when an utterance's text is unknown."""
    if any(t.utt.text is None for t in turns):
        return None
    return [f"{uri} 1 {t.talker} {t.start:.3f} {t.end:.3f} {t.utt.text}" for t in sorted(turns, key=lambda t: t.start)]


def generate(out: Path, count: int, seed: int, data: Path | None, talkers: tuple[int, int] = (2, 6),
             max_overlap: float = 0.3, duration: tuple[float, float] = (30.0, 90.0), n_espeak: int = 60,
             first: int = 0, gain_db: tuple[float, float] = (-6.0, 0.0), noise_dbfs: float = -55.0,
             reverb: float = 0.0) -> list[dict]:
    """Write meetings ``first .. first+count-1`` of set ``seed`` under ``out``; returns their manifest rows.

    Meeting ``i`` depends only on ``(seed, i)`` and the options, so a set grows by raising ``count`` (or
    generating more with ``first``) without changing the meetings already there.
    Raises ``ValueError`` for bad options, ``RuntimeError`` when espeak-ng is needed and fails."""
    if not 2 <= talkers[0] <= talkers[1]:
        raise ValueError(f"talkers must be a range within 2.., got {talkers}")
    if not 0 <= max_overlap < 0.9:
        raise ValueError(f"max_overlap must be in [0, 0.9), got {max_overlap}")
    pool = talker_pool(np.random.default_rng([seed, 0]), data, n_espeak)
    if len(pool) < talkers[1]:
        raise ValueError(f"only {len(pool)} talkers available, {talkers[1]} asked")
    voices = Voices(data, out / "_cache")
    rows = []
    span = talkers[1] - talkers[0] + 1
    for i in range(first, first + count):
        rng = np.random.default_rng([seed, 1, i])
        n = talkers[0] + i % span
        target = float(rng.uniform(0, max_overlap))
        dur = float(rng.uniform(*duration))
        mix, turns, _ = make_meeting(rng, pool, voices, n, target, dur, gain_db, noise_dbfs, reverb)
        name = f"en_sim_s{seed}_{i:04d}_{n}spk"
        d = out / name
        d.mkdir(parents=True, exist_ok=True)
        write_wav(d / f"{name}.wav", mix)
        (d / f"{name}.rttm").write_text("\n".join(rttm_lines(name, turns)) + "\n")
        stm = stm_lines(name, turns)
        if stm is not None:
            (d / f"{name}.stm").write_text("\n".join(stm) + "\n")
        elif (d / f"{name}.stm").exists():
            (d / f"{name}.stm").unlink()
        rows.append({"id": f"{name}/{name}.wav", "talkers": sorted({t.talker for t in turns}),
                     "n_talkers": len({t.talker for t in turns}), "target_overlap": round(target, 4),
                     "overlap": round(overlap_ratio(merged_turns(turns)), 4),
                     "duration_s": round(mix.size / SAMPLE_RATE, 3), "turns": len(turns), "stm": stm is not None})
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("out", help="output folder (outside the repository)")
    p.add_argument("--count", type=int, default=40)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--first", type=int, default=0, help="index of the first meeting (to grow a set)")
    p.add_argument("--data", default=None, help="shared data folder (real talkers); default $DIARIST_TEST_DATA")
    p.add_argument("--talkers", type=int, nargs=2, default=(2, 6), metavar=("MIN", "MAX"))
    p.add_argument("--max-overlap", type=float, default=0.3)
    p.add_argument("--duration", type=float, nargs=2, default=(30.0, 90.0), metavar=("MIN", "MAX"))
    p.add_argument("--espeak-talkers", type=int, default=60)
    p.add_argument("--gain-db", type=float, nargs=2, default=(-6.0, 0.0), metavar=("MIN", "MAX"),
                   help="each talker's level (dB, drawn per meeting); e.g. -24 0 for far, quiet talkers")
    p.add_argument("--noise-dbfs", type=float, default=-55.0, help="white noise floor before normalisation")
    p.add_argument("--reverb", type=float, default=0.0, metavar="RT60_MAX",
                   help="each talker in a synthetic room, reverberation time up to this (s); 0: dry")
    args = p.parse_args(argv)
    import os

    out = Path(args.out).resolve()
    repo = Path(__file__).resolve().parents[1]
    if out == repo or repo in out.parents:
        print(f"simulate_meetings: {out} is inside the repository; generated audio is never committed",
              file=sys.stderr)
        return 2
    data = args.data or os.environ.get("DIARIST_TEST_DATA")
    rows = generate(out, args.count, args.seed, Path(data) if data else None, tuple(args.talkers),
                    args.max_overlap, tuple(args.duration), args.espeak_talkers, args.first,
                    tuple(args.gain_db), args.noise_dbfs, args.reverb)
    manifest = out / "manifest.json"
    old = json.loads(manifest.read_text())["meetings"] if manifest.is_file() else []
    keep = {r["id"]: r for r in old}
    keep.update({r["id"]: r for r in rows})
    manifest.write_text(json.dumps({"command": shlex.join(["python", "benchmarks/simulate_meetings.py", *sys.argv[1:]]),
                                    "seed": args.seed, "meetings": sorted(keep.values(), key=lambda r: r["id"])},
                                   indent=1))
    print(f"{len(rows)} meetings written to {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
