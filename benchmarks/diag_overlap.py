"""Overlapped speech and speaker-count hints of the speaker cascade, scored on its turns.

For every item with an RTTM under DATA_DIR (the stereo clip downmixed to mono, so that the cascade, not
the per-channel path, has to find its two overlapping talkers): ``detect_speech`` ▸ ``diarize``, scored
with pyannote.metrics (``DiarizationErrorRate``, collar 0.25 s each side, i.e. pyannote ``collar=0.5``,
overlap scored, UEM = the whole file): DER and its missed / false alarm / confusion seconds over the
whole file and over the reference's overlapped regions only (UEM = the instants where at least two
reference speakers talk, no collar there: the collar would remove most of those short regions), plus
seconds of hypothesis overlap. Then the speaker-count hints: for ``N`` in 1..reference count + 1 the
speakers found with ``num_speakers=N``, ``min_speakers=N`` and ``max_speakers=N``.

Run from the repo root: PYTHONPATH=. python benchmarks/diag_overlap.py $DIARIST_TEST_DATA OUT.json
"""
from __future__ import annotations

import datetime as dt
import json
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
from pyannote.core import Annotation, Segment, Timeline
from pyannote.metrics.diarization import DiarizationErrorRate

from transcription.audio import SAMPLE_RATE, decode_audio
from transcription.audio.vad import detect_speech
from transcription.diarization import diarize


def read_rttm(path: Path) -> Annotation:
    """A pyannote ``Annotation`` from the standard 10-field RTTM ``SPEAKER`` lines."""
    ann = Annotation(uri=path.stem)
    for i, line in enumerate(path.read_text().splitlines()):
        f = line.split()
        if f and f[0] == "SPEAKER":
            ann[Segment(float(f[3]), float(f[3]) + float(f[4])), i] = f[7]
    return ann


def overlap_timeline(ann: Annotation) -> Timeline:
    """Instants where at least two labels of ``ann`` are active."""
    segs = []
    tracks = list(ann.itertracks(yield_label=True))
    for i, (a, _, la) in enumerate(tracks):
        for b, _, lb in tracks[i + 1:]:
            if la != lb and (a & b):
                segs.append(a & b)
    return Timeline(segs).support()


def score(ref: Annotation, hyp: Annotation, uem: Timeline, collar: float) -> dict:
    """DER (None when the UEM holds no reference speech) and its components in seconds."""
    if not uem:
        return {"der": None, "missed_s": 0.0, "false_alarm_s": 0.0, "confusion_s": 0.0, "total_s": 0.0}
    d = DiarizationErrorRate(collar=2 * collar, skip_overlap=False)(ref, hyp, uem=uem, detailed=True)
    total = d["total"]
    return {"der": round(d["diarization error rate"], 4) if total > 0 else None,
            "missed_s": round(d["missed detection"], 3), "false_alarm_s": round(d["false alarm"], 3),
            "confusion_s": round(d["confusion"], 3), "total_s": round(total, 3)}


def run_item(audio: Path, rttm: Path) -> dict:
    wave = decode_audio(audio).mono
    speech = detect_speech(wave)
    duration = wave.size / SAMPLE_RATE
    ref = read_rttm(rttm)
    uem = Timeline([Segment(0.0, duration)])
    ref_overlap = overlap_timeline(ref)

    def turns_ann(**hints) -> Annotation:
        ann = Annotation(uri=rttm.stem)
        for i, t in enumerate(diarize(wave, speech, **hints)):
            ann[Segment(t.start, t.end), i] = t.speaker
        return ann

    hyp = turns_ann()
    n_ref = len(ref.labels())
    hints = {}
    for n in range(1, n_ref + 2):
        hints[str(n)] = {k: len(turns_ann(**{k: n}).labels()) for k in ("num_speakers", "min_speakers", "max_speakers")}
    return {
        "audio": str(audio), "duration_s": round(duration, 3), "reference_speakers": n_ref,
        "speakers": len(hyp.labels()),
        "reference_overlap_s": round(ref_overlap.duration(), 3),
        "hypothesis_overlap_s": round(overlap_timeline(hyp).duration(), 3),
        "c0.25": score(ref, hyp, uem, 0.25),
        "c0": score(ref, hyp, uem, 0.0),
        "overlap_regions_c0": score(ref, hyp, ref_overlap, 0.0),
        "speakers_with_hint": hints,
    }


def main(data_dir: str, out: str) -> None:
    data = Path(data_dir)
    items = {}
    for rttm in sorted(data.glob("*/*.rttm")):
        audio = rttm.with_suffix(".wav")
        if audio.is_file():
            items[f"{rttm.parent.name}/{audio.name}"] = r = run_item(audio, rttm)
            print(rttm.parent.name, json.dumps({k: r[k] for k in ("speakers", "c0.25", "overlap_regions_c0")}),
                  file=sys.stderr, flush=True)
    ami = [v["c0.25"]["der"] for k, v in items.items() if "_ami_meeting_" in k]
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                            check=False).stdout.strip()
    dirty = bool(subprocess.run(["git", "status", "--porcelain", "transcription"], capture_output=True, check=False,
                                text=True).stdout.strip())
    report = {"command": " ".join(shlex.quote(a) for a in ["python", *sys.argv]), "git_commit": commit,
              "transcription_dirty": dirty, "created_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
              "what": __doc__.split("\n\n")[0], "ami_mean_der_c0.25": round(float(np.mean(ami)), 4) if ami else None,
              "items": items}
    Path(out).write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps({"ami_mean_der_c0.25": report["ami_mean_der_c0.25"]}), file=sys.stderr)


if __name__ == "__main__":
    main(*sys.argv[1:3])
