"""What segmentation-3.0 can see of each reference speaker: the evidence behind issue 4's open speaker count.

For every item with an RTTM under DATA_DIR, and for each reference speaker: seconds of speech, seconds of
*solo* speech (no other reference speaker at that instant), and what the segmentation model says over
that speaker's frames, aggregated over the chunks that see a frame as the pipeline does
(``transcription.audio.activity.aggregate``): the largest probability of a two-speaker (overlap) class,
and the share of the speaker's frames that hard powerset decoding gives two local speakers. Per item:
how many chunks decode to 1, 2 or 3 distinct local speakers anywhere in them.

A speaker who never talks alone for long and whose overlapped frames never decode to a second local
speaker has no local speaker of their own, hence no embedding, so no clustering cut can count them.

Run from the repo root: .venv/bin/python benchmarks/diag_speaker_evidence.py $DIARIST_TEST_DATA OUT.json
"""
import datetime as dt
import json
import subprocess
import sys
from pathlib import Path

import numpy as np

from transcription.audio.activity import aggregate, frame_edges, grid_size
from transcription.audio.decode import SAMPLE_RATE, decode_audio
from transcription.audio.segmentation import segment, to_multilabel


def read_rttm(path: Path) -> dict[str, list[tuple[float, float]]]:
    """``{speaker: [(start, end)]}`` seconds from the standard 10-field RTTM ``SPEAKER`` lines."""
    turns: dict[str, list[tuple[float, float]]] = {}
    for line in path.read_text().splitlines():
        f = line.split()
        if f and f[0] == "SPEAKER":
            turns.setdefault(f[7], []).append((float(f[3]), float(f[3]) + float(f[4])))
    return turns


def mask(turns: list[tuple[float, float]], centres: np.ndarray) -> np.ndarray:
    m = np.zeros(centres.size, bool)
    for s, e in turns:
        m |= (centres >= s) & (centres < e)
    return m


def item_evidence(audio: Path, rttm: Path) -> dict:
    wave = decode_audio(audio).samples[0]
    offsets, probs = segment(wave)
    num = grid_size(wave.size, offsets, probs.shape[1])
    edges = frame_edges(num)
    centres = (edges[:-1] + edges[1:]) / 2
    step = float(edges[2] - edges[1])
    hard = to_multilabel(probs)  # [C, F, 3]
    overlap_prob, _ = aggregate(offsets, probs[..., 4:].sum(-1), num)
    two_local, _ = aggregate(offsets, (hard.sum(-1) >= 2).astype(np.float32), num)
    ref = read_rttm(rttm)
    masks = {spk: mask(t, centres) for spk, t in ref.items()}
    speakers = {}
    for spk, m in masks.items():
        others = np.zeros(num, bool)
        for o, mo in masks.items():
            if o != spk:
                others |= mo
        speakers[spk] = {
            "speech_s": round(float(m.sum() * step), 2),
            "solo_speech_s": round(float((m & ~others).sum() * step), 2),
            "max_overlap_class_prob": round(float(overlap_prob[m].max()), 3) if m.any() else None,
            "share_of_frames_with_two_local_speakers": round(float((two_local[m] >= 0.5).mean()), 3) if m.any() else None,
        }
    distinct = hard.max(1).sum(-1).astype(int)  # local speakers active anywhere in each chunk
    return {"audio": str(audio), "duration_s": round(wave.size / SAMPLE_RATE, 3), "reference_speakers": len(ref),
            "chunks_by_local_speaker_count": {str(k): int((distinct == k).sum()) for k in range(4)},
            "speakers": speakers}


def main(data_dir: str, out: str) -> None:
    items = {}
    for rttm in sorted(Path(data_dir).rglob("*.rttm")):
        audio = next((p for p in rttm.parent.iterdir()
                      if p.stem == rttm.stem and p.suffix in {".wav", ".flac", ".mp3", ".ogg", ".m4a"}), None)
        if audio is None:
            continue
        items[rttm.parent.name] = item_evidence(audio, rttm)
        print(rttm.parent.name, json.dumps(items[rttm.parent.name]["speakers"]), flush=True)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], check=True, capture_output=True, text=True).stdout.strip()
    with open(out, "w") as f:
        json.dump({"command": ".venv/bin/python " + " ".join(sys.argv), "git_commit": commit,
                   "created_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
                   "what": __doc__.split("\n\n")[0], "items": items}, f, indent=2)


if __name__ == "__main__":
    main(*sys.argv[1:3])
