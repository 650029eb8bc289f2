"""Clustering-cut sensitivity: `diarist eval` on the four RTTM items and the one-reader en/de recording at
several cuts of ``transcription.diarization.pipeline.THRESHOLD``, plus leave-one-out over the four RTTM items.
DER is of the transcript's speaker turns (what the RTTM export writes), collar 0.25 s each side.

Run from the repo root: .venv/bin/python benchmarks/eval_threshold_sweep.py OUT.json
"""
import datetime as dt
import json
import subprocess
import sys
from pathlib import Path

import numpy as np

import transcription.diarization.pipeline as P
from cli.commands.eval import engine_transcribe_fn
from evaluation.harness import evaluate

ITEMS = ["en_2spk*", "en_ami_meeting*", "multi_en_de*"]
THRESHOLDS = [0.40, 0.45, 0.50, 0.55, 0.60, 0.65, 0.70]
DEFAULT = P.THRESHOLD
fn = engine_transcribe_fn("whisper", None, "cpu", True)
rows = {}
for thr in THRESHOLDS:
    P.THRESHOLD = thr
    rep = evaluate("../shared/data", fn, collars=(0.25,), patterns=ITEMS)
    rows[f"{thr:.2f}"] = {r["id"]: {"der_c0.25": r.get("der_c0.25"), "hyp_speakers": r.get("hyp_speakers"),
                                     "ref_speakers": r.get("ref_speakers"), "cpwer": r.get("cpwer"), "wer": r.get("wer")}
                          for r in rep["items"]}
    print(thr, {k.split("/")[0][-12:]: (round(100 * (v["der_c0.25"] or 0), 1), v["hyp_speakers"])
                for k, v in rows[f"{thr:.2f}"].items()}, flush=True)
ami = lambda t: [v["der_c0.25"] for k, v in rows[t].items() if "ami_meeting" in k]
multi = lambda t: next(v["hyp_speakers"] for k, v in rows[t].items() if "multi_en_de" in k)
phone = lambda t: next(v["der_c0.25"] for k, v in rows[t].items() if "phonecall" in k)
items = [k for k in next(iter(rows.values())) if "multi_en_de" not in k]
# leave-one-out over the four items: pick the cut with the lowest mean DER on three, score the fourth
loo = {}
for held in items:
    rest = [i for i in items if i != held]
    best = min(rows, key=lambda t: (np.mean([rows[t][i]["der_c0.25"] for i in rest]), abs(float(t) - DEFAULT)))
    loo[held] = {"chosen_cut": float(best), "held_out_der_c0.25": rows[best][held]["der_c0.25"],
                 "der_c0.25_at_default": rows[f"{DEFAULT:.2f}"][held]["der_c0.25"]}
commit = subprocess.run(["git", "rev-parse", "HEAD"], check=False, capture_output=True, text=True).stdout.strip()
out = {"command": ".venv/bin/python " + " ".join(sys.argv), "git_commit": commit,
       "created_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
       "what": f"transcript DER on its speaker turns (collar 0.25 s each side, overlap scored) and speaker counts from diarist eval, "
               f"transcription.diarization.pipeline.THRESHOLD set to each cut (default {DEFAULT}); everything else default",
       "driver_source": Path(__file__).read_text(),
       "by_cut": {t: {"items": r, "ami_mean_der_c0.25": float(np.mean(ami(t))), "phone_der_c0.25": phone(t),
                      "one_reader_en_de_speakers": multi(t)}
                  for t, r in rows.items()},
       "leave_one_out": loo}
Path(sys.argv[1]).write_text(json.dumps(out, indent=2))
print(json.dumps({t: (round(100 * v["ami_mean_der_c0.25"], 1), round(100 * v["phone_der_c0.25"], 1)) for t, v in out["by_cut"].items()}))
print(json.dumps(loo, indent=1))
