"""How far apart CAM++ puts talkers: cosine similarity of solo stretches of one talker vs of different
talkers of the same recording, from the RTTM (stretches where no other talker speaks, 1.5-4 s, one
embedding each, the cascade's own CAM++). Run on the simulated set and on the real multi-speaker items,
it says whether the simulated talkers are as distinct for the embedder as real ones (the clustering cut,
``pipeline.THRESHOLD``, is a cosine distance, so a set whose different talkers sit closer than real ones
would pull the cut down).

Run from the repo root:
    PYTHONPATH=. python benchmarks/diag_separability.py OUT.json /work/tmp/simset $DIARIST_TEST_DATA
"""

from __future__ import annotations

import datetime as dt
import json
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np

from transcription.audio import decode_audio
from transcription.diarization.embedders import default_embedder

MAX_ITEMS = 12


def solo_stretches(rttm: Path) -> list[tuple[str, float, float]]:
    """``(talker, start, end)`` stretches of 1.5-4 s where only that talker speaks."""
    segs = []
    for line in rttm.read_text().splitlines():
        f = line.split()
        if f and f[0] == "SPEAKER":
            segs.append((f[7], float(f[3]), float(f[3]) + float(f[4])))
    out = []
    for k, s, e in segs:
        cur = s
        for s2, e2 in sorted((s2, e2) for k2, s2, e2 in segs if k2 != k and e2 > s and s2 < e):
            if s2 > cur + 1.5:
                out.append((k, cur, min(s2, cur + 4.0)))
            cur = max(cur, e2)
        if e > cur + 1.5:
            out.append((k, cur, min(e, cur + 4.0)))
    return out


def main(out: str, *roots: str) -> None:
    emb = default_embedder("cpu")
    report = {}
    for root in roots:
        same, diff, items = [], [], []
        for rttm in sorted(Path(root).glob("*/*.rttm")):
            audio = rttm.with_suffix(".wav")
            so = solo_stretches(rttm)
            if not audio.is_file() or len({k for k, _, _ in so}) < 2:
                continue
            if len(items) == MAX_ITEMS:
                break
            e = emb.embed(decode_audio(str(audio)).mono, [(s, t) for _, s, t in so])
            lab = np.array([k for k, _, _ in so])
            sim = e @ e.T
            iu = np.triu_indices(len(lab), 1)
            m = (lab[:, None] == lab[None, :])[iu]
            same += sim[iu][m].tolist()
            diff += sim[iu][~m].tolist()
            items.append(rttm.parent.name)
        d = np.array(diff)
        report[root] = {"items": items, "same_talker_mean": float(np.mean(same)) if same else None,
                        "different_talkers_mean": float(d.mean()) if d.size else None,
                        "different_talkers_p90": float(np.percentile(d, 90)) if d.size else None,
                        "different_above_0.4": float((d > 0.4).mean()) if d.size else None,
                        "pairs_same": len(same), "pairs_different": len(diff)}
        print(root, json.dumps({k: v for k, v in report[root].items() if k != "items"}), file=sys.stderr)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=False).stdout.strip()
    Path(out).write_text(json.dumps({"command": shlex.join(["python", *sys.argv]), "git_commit": commit,
                                     "created_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
                                     "what": __doc__.split("\n\n")[0], "sets": report}, indent=1) + "\n")


if __name__ == "__main__":
    main(*sys.argv[1:])
