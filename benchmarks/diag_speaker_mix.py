"""Speaker count on mixed content: shared recordings of distinct talkers and 20 s of orchestral music,
concatenated (0.5 s of silence between parts, each part peak-normalised to 0.5), through
``detect_speech`` ▸ ``diarize`` with no hints.

Seven voices: JFK (twice, from two files: one voice), LibriSpeech 1995 and 1272, the phone call's two
talkers, the English/German reader, AMI headset FEE041. Reported: labels found, seconds of each label in
each part, seconds labelled inside the music (a phantom), and two pyannote.metrics figures against a
reference built from the parts (the phone call from its RTTM, every other part one voice over the
cascade's own speech regions inside it, so only speaker errors count): confusion seconds and DER. Then
the labels found with ``num_speakers`` 5-8, ``min_speakers=8`` and ``max_speakers=5``.

Run from the repo root: PYTHONPATH=. python benchmarks/diag_speaker_mix.py $DIARIST_TEST_DATA OUT.json
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

PARTS = [  # (part, voice, file, seconds kept or None for all)
    ("jfk", "JFK", "en_jfk_inaugural/jfk.flac", None),
    ("music", None, ("music_brahms_hungarian_dance5_ogg/"
                     "Hungarian_Dance_number_5_-_Allegro_in_F_sharp_minor_(string_orchestra).ogg"), 20.0),
    ("librispeech_1995", "LS1995", "en_librispeech_1995-1837-0001/librispeech-1995-1837-0001.wav", None),
    ("phone_call", "rttm", "en_2spk_phonecall_pyannote_sample/sample.wav", None),
    ("reader_en_de", "READER", "multi_en_de_codeswitch_mp3_fasterwhisper/multilingual.mp3", None),
    ("librispeech_1272", "LS1272", "en_librispeech_1272-128104-0000_picovoice/test.wav", None),
    ("ami_headset", "FEE041", "en_ami_headset_ES2011a_40-46s/ES2011a.Headset-0-40s-46s.wav", None),
    ("jfk_again", "JFK", "en_jfk_inaugural/jfk.mp3", None),
]


def main(data_dir: str, out: str) -> None:
    data = Path(data_dir)
    waves, spans, t = [], [], 0.0
    for name, voice, rel, keep in PARTS:
        w = decode_audio(data / rel).mono
        w = w[: int(keep * SAMPLE_RATE)] if keep else w
        w = 0.5 * w / max(1e-6, float(np.abs(w).max()))
        spans.append((name, voice, rel, t, t + w.size / SAMPLE_RATE))
        waves += [w, np.zeros(SAMPLE_RATE // 2, np.float32)]
        t += w.size / SAMPLE_RATE + 0.5
    wave = np.concatenate(waves).astype(np.float32)
    speech = detect_speech(wave)
    turns = diarize(wave, speech)
    hyp = Annotation()
    for i, x in enumerate(turns):
        hyp[Segment(x.start, x.end), i] = f"S{x.speaker}"
    ref = Annotation()
    parts = {}
    for name, voice, rel, a, b in spans:
        if voice == "rttm":
            for line in (data / rel).with_suffix(".rttm").read_text().splitlines():
                f = line.split()
                ref[Segment(a + float(f[3]), a + float(f[3]) + float(f[4])), len(ref)] = f[7]
        elif voice:
            for s, e in speech:
                if min(b, e) > max(a, s):
                    ref[Segment(max(a, s), min(b, e)), len(ref)] = voice
        share = {}
        for x in turns:
            o = min(b, x.end) - max(a, x.start)
            if o > 0:
                share[f"S{x.speaker}"] = round(share.get(f"S{x.speaker}", 0.0) + o, 2)
        parts[name] = {"start_s": round(a, 2), "end_s": round(b, 2), "voice": voice, "labelled_s": share}
    d = DiarizationErrorRate(collar=0.5, skip_overlap=False)(ref, hyp, uem=Timeline([Segment(0, t)]), detailed=True)
    report = {
        "command": " ".join(shlex.quote(a) for a in ["python", *sys.argv]),
        "git_commit": subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                                     check=False).stdout.strip(),
        "created_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "what": __doc__.split("\n\n")[0], "duration_s": round(t, 2), "voices": len(ref.labels()),
        "labels_found": len(hyp.labels()), "phantom_s_on_music": sum(parts["music"]["labelled_s"].values()),
        "der_c0.25": round(d["diarization error rate"], 4), "confusion_s": round(d["confusion"], 3),
        "parts": parts,
        "speakers_with_hint": {f"{k}={n}": len({x.speaker for x in diarize(wave, speech, **{k: n})})
                               for k, n in [("num_speakers", 5), ("num_speakers", 6), ("num_speakers", 7),
                                            ("num_speakers", 8), ("min_speakers", 8), ("max_speakers", 5)]},
    }
    Path(out).write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps({k: report[k] for k in ("voices", "labels_found", "phantom_s_on_music", "der_c0.25",
                                             "speakers_with_hint")}))


if __name__ == "__main__":
    main(*sys.argv[1:3])
