"""Speaker-only evaluation of the cascade: ``detect_speech`` ▸ ``diarize`` on every RTTM item of a data
folder, scored by ``diarist eval``'s own scorer (``evaluation.harness.evaluate``: DER/JER at collars 0 and
0.25 with the split into missed speech, missed overlap, false alarm and confusion, the share of
overlapped reference speech given two speakers, the speaker-count error). No transcription, so text
metrics are left out of the report.

Multichannel items (the stereo overlap clip) are downmixed to mono: the cascade, not the per-channel path,
must find their overlapping talkers (as ``diag_overlap.py`` does).

``--variant NAME=JSON`` (repeatable) runs the same items again with module constants overridden, e.g.
``--variant low_train='{"transcription.diarization.pipeline.TRAIN_CLEAN_S": 0.5}'`` (a value
``"py:module:attr"`` names an object, e.g. an alternative function from ``benchmarks/speaker_variants.py``);
within one run the
speech regions and the CAM++ embeddings of identical calls are computed once (exact reuse: same inputs,
same outputs), so variants of the decision logic cost little. The baseline (no override) is always run.

Run from the repo root:
    PYTHONPATH=. python benchmarks/eval_speakers.py /work/tmp/simset benchmarks/results/x.json
    PYTHONPATH=. python benchmarks/eval_speakers.py $DIARIST_TEST_DATA OUT.json --items 'en_ami_meeting*' \\
        --items 'en_2spk*' --items 'en_stereo*'
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import importlib
import json
import pickle
import shlex
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from diarist.contract.result import TranscriptionResult
from evaluation.harness import evaluate
from transcription.audio import SAMPLE_RATE, decode_audio
from transcription.audio.vad import detect_speech
from transcription.diarization import diarize
from transcription.diarization.embedders import default_embedder

TEXT_KEYS = ("wer", "cer", "cpwer", "cpcer")


class DiskMemo:
    """Results remembered by key, in memory and (with a folder) as ``.npy``/``.json`` files across runs."""

    def __init__(self, folder: Path | None):
        self.folder, self.mem = folder, {}
        if folder:
            folder.mkdir(parents=True, exist_ok=True)

    def get(self, key: str, make):
        if key in self.mem:
            return self.mem[key]
        path = self.folder / f"{key}.pkl" if self.folder else None
        if path is not None and path.is_file():
            value = pickle.loads(path.read_bytes())
        else:
            value = make()
            if path is not None:
                path.write_bytes(pickle.dumps(value))
        self.mem[key] = value
        return value


def wave_key(wave: np.ndarray) -> str:
    return hashlib.blake2b(memoryview(np.ascontiguousarray(wave, np.float32)), digest_size=12).hexdigest()


class ReusingEmbedder:
    """CAM++ whose results are remembered per call (recording hash, windows, masks): identical calls of
    several variants reuse one computation."""

    name = "campplus"

    def __init__(self, memo: DiskMemo):
        self.inner = default_embedder("cpu")
        self.memo = memo

    def embed(self, wave, windows, masks=None, should_cancel=None):
        h = hashlib.blake2b(digest_size=16)
        h.update(memoryview(np.ascontiguousarray(wave, np.float32)))
        h.update(repr([(round(a, 4), round(b, 4)) for a, b in windows]).encode())
        for m in masks or ():
            h.update(np.packbits(np.asarray(m, bool)).tobytes())
        return self.memo.get("emb_" + h.hexdigest(), lambda: self.inner.embed(wave, windows, masks))


def reuse_segmentation(memo: DiskMemo) -> None:
    """``segment_cached`` (shared by speech detection and diarization) remembered in ``memo``: the
    segmentation of a recording is computed once for every variant and run."""
    from transcription.audio import segmentation
    from transcription.diarization import pipeline

    plain = segmentation.segment

    def segment(wave, step_s=segmentation.STEP_S, batch=None, device="cpu", should_cancel=None):
        return memo.get(f"seg_{wave_key(wave)}_{step_s}", lambda: plain(wave, step_s, batch, device))

    segmentation.segment = segment
    segmentation.CACHE_ENTRIES = 0
    pipeline.segment_cached = segmentation.segment_cached


@contextmanager
def overrides(values: dict[str, object]):
    """Module attributes set to ``values`` (``"pkg.module.NAME": value``) for the block, then restored."""
    old = []
    try:
        for path, v in values.items():
            mod, name = path.rsplit(".", 1)
            m = importlib.import_module(mod)
            old.append((m, name, getattr(m, name)))
            if isinstance(v, str) and v.startswith("py:"):  # "py:package.module:attr", e.g. an experiment
                src, attr = v[3:].rsplit(":", 1)
                v = getattr(importlib.import_module(src), attr)
            setattr(m, name, v)
        yield
    finally:
        for m, name, v in reversed(old):
            setattr(m, name, v)


def cascade_fn(embedder: ReusingEmbedder, memo: DiskMemo, values: dict):
    """A ``transcribe_fn`` for :func:`evaluation.harness.evaluate` whose result holds only speaker turns;
    the speech regions are remembered per recording and per override of ``transcription.audio``."""
    vad_values = json.dumps({k: v for k, v in values.items() if k.startswith("transcription.audio")}, sort_keys=True)
    vad_tag = "" if vad_values == "{}" else "_" + hashlib.blake2b(vad_values.encode(), digest_size=6).hexdigest()

    def run(path, **hints):
        wave = decode_audio(str(path)).mono
        speech = memo.get(f"vad_{wave_key(wave)}{vad_tag}", lambda: detect_speech(wave))
        turns = diarize(wave, speech, embedder=embedder)
        segs = [{"start": t.start, "end": t.end, "speaker": t.speaker, "text": ""} for t in turns]
        return TranscriptionResult.from_json({"duration": wave.size / SAMPLE_RATE, "language": "en", "model": "cascade",
                                              "segments": segs, "turns": segs, "finish_reason": "stop",
                                              "coverage": None, "no_speech": not segs, "metrics": {}})

    return run


def slim(report: dict) -> dict:
    """The report without text metrics (no transcript was made) and without per-item pyannote internals."""
    for r in report["items"]:
        for k in list(r):
            if k.startswith(TEXT_KEYS + ("cp_", "hyp_words")) or k.endswith("_components") or k in (
                    "language", "language_source", "model", "finish_reason", "coverage", "no_speech", "wer_errors",
                    "wer_deletions", "ref_words", "cer_errors", "ref_chars", "scoring"):
                r.pop(k)
        r.pop("reference_errors", None)
    for o in [report["overall"], *report.get("by_language", {}).values()]:
        for k in list(o):
            if k.startswith(TEXT_KEYS) or k.startswith("no_speech"):
                o.pop(k)
    report.pop("by_language", None)
    return report


def summary(report: dict, max_talkers: int = 4) -> dict:
    """Headline figures: pooled DER split at both collars, overlap share, speaker count exact (all items
    and those with at most ``max_talkers`` reference speakers), AMI mean DER at collar 0.25."""
    o = report["overall"]
    items = [r for r in report["items"] if r.get("ref_speakers") is not None and "error" not in r]
    small = [r for r in items if r["ref_speakers"] <= max_talkers]
    ami = [r["der_c0.25"] for r in items if "_ami_meeting_" in r["id"] and r.get("der_c0.25") is not None]
    out = {k: o.get(k) for k in ("der_c0", "der_c0.25", "der_c0.25_mean", "der_c0.25_missed_speech",
                                 "der_c0.25_missed_overlap", "der_c0.25_false_alarm", "der_c0.25_confusion",
                                 "der_c0_missed_overlap", "overlap_c0_two_speakers", "overlap_c0.25_two_speakers",
                                 "speaker_count_error_mean", "speaker_count_exact", "speaker_count_items")}
    out[f"speaker_count_exact_upto{max_talkers}"] = f"{sum(r['speaker_count_error'] == 0 for r in small)}/{len(small)}"
    out["ami_mean_der_c0.25"] = float(np.mean(ami)) if ami else None
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("data_dir")
    p.add_argument("out")
    p.add_argument("--items", action="append", default=None, help="item id pattern (fnmatch); repeatable")
    p.add_argument("--variant", action="append", default=[], help="NAME=JSON of module overrides; repeatable")
    p.add_argument("--cache", default=None, help="folder remembering speech regions, segmentation and CAM++ "
                                                 "calls across runs (same inputs, same outputs)")
    p.add_argument("--no-baseline", action="store_true", help="run only the --variant sets")
    args = p.parse_args(argv)
    variants = {} if args.no_baseline else {"baseline": {}}
    for v in args.variant:
        name, _, js = v.partition("=")
        variants[name] = json.loads(js)
    memo = DiskMemo(Path(args.cache) if args.cache else None)
    reuse_segmentation(memo)
    embedder = ReusingEmbedder(memo)
    reports = {}
    for name, values in variants.items():
        t0 = time.perf_counter()
        with overrides(values):
            rep = slim(evaluate(args.data_dir, cascade_fn(embedder, memo, values), patterns=args.items))
        rep["overrides"] = values
        rep["summary"] = summary(rep)
        rep["wall_s"] = round(time.perf_counter() - t0, 1)
        reports[name] = rep
        print(name, json.dumps(rep["summary"]), file=sys.stderr, flush=True)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=False).stdout.strip()
    dirty = bool(subprocess.run(["git", "status", "--porcelain", "transcription"], capture_output=True, text=True,
                                check=False).stdout.strip())
    Path(args.out).write_text(json.dumps({
        "command": shlex.join(["python", "benchmarks/eval_speakers.py", *(argv or sys.argv[1:])]),
        "git_commit": commit, "transcription_dirty": dirty,
        "created_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"), "what": __doc__.split("\n\n")[0],
        "variants": reports}, indent=1, default=float) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
