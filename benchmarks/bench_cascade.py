"""Speaker cascade throughput on the CPU and on the engine's GPU (issue 16 item 3).

The Whisper path's cascade (speech detection: Silero + segmentation-3.0; diarization: segmentation-3.0 +
CAM++ + clustering) runs in the engine process, on the engine's device since each family pipeline passes it
(``transcription.speech.cascade_device``). This measures, for each device, the cascade's audio seconds per wall
second on real recordings at 1 and ``--concurrency`` threads of a pool warmed by one untimed round (each
thread a recording of its own: the samples are made unique so the segmentation cache never serves a
repeat), and checks that the CUDA turns
agree with the CPU ones (share of 10 ms frames with the same speaker set after the best speaker mapping).

Run on the GPU machine (no PyAV there: ``--npy-dir`` holds ``<stem>.npy`` 16 kHz float32 waveforms)::

    python3 benchmarks/bench_cascade.py --npy-dir DIR --commit SHA --out benchmarks/results/cascade_h200.json
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

from transcription.audio.vad import detect_speech
from transcription.diarization import diarize

CLIPS = ["en_2spk_phonecall_pyannote_sample/sample.wav", "en_ami_meeting_dev00_2spk/dev00.wav",
         "en_ami_meeting_trn05_4spk/trn05.wav", "en_ami_meeting_trn07_4spk/trn07.wav"]
_serial = itertools.count(1)
_serial_lock = threading.Lock()


def load(npy_dir: str | None, data_dir: str) -> dict[str, np.ndarray]:
    out = {}
    for rel in CLIPS:
        stem = Path(rel).stem
        if npy_dir:
            out[stem] = np.load(Path(npy_dir) / f"{stem}.npy")
        else:
            from transcription.audio import decode_audio

            out[stem] = decode_audio(str(Path(data_dir) / rel)).mono
    return out


def cascade(wave: np.ndarray, device: str) -> list:
    """VAD then diarization of one recording on ``device``; the turns."""
    return diarize(wave, detect_speech(wave, device=device), device=device)


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


def throughput(waves: list[np.ndarray], device: str, concurrency: int, rounds: int) -> dict:
    def one(w: np.ndarray) -> float:
        w = w.copy()
        with _serial_lock:
            w[0] += next(_serial) * 1e-7  # unique samples: no segmentation cache hit
        cascade(w, device)
        return w.size / 16000

    jobs = [waves[i % len(waves)] for i in range(concurrency * rounds)]
    with ThreadPoolExecutor(concurrency) as pool:
        # untimed round first: each thread's first CUDA work creates its stream and library handles, a
        # one-time cost per thread (the engine server's threads are long-lived)
        list(pool.map(one, jobs[:concurrency]))
        t0 = time.perf_counter()
        audio = sum(pool.map(one, jobs))
        wall = time.perf_counter() - t0
    return {"device": device, "concurrency": concurrency, "recordings": len(jobs), "audio_s": audio,
            "wall_s": wall, "audio_s_per_s": audio / wall}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--npy-dir", default=None)
    ap.add_argument("--data-dir", default="../shared/data")
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=4, help="timed recordings per thread")
    ap.add_argument("--commit", default="")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    waves = load(args.npy_dir, args.data_dir)
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    res: dict = {"command": " ".join(sys.argv), "commit": args.commit, "cpu_threads": torch.get_num_threads(),
                 "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
                 "torch": torch.__version__, "agreement_cuda_vs_cpu": {}, "runs": []}
    turns = {d: {k: cascade(w, d) for k, w in waves.items()} for d in devices}  # also warms each device up
    if "cuda" in devices:
        for k, w in waves.items():
            res["agreement_cuda_vs_cpu"][k] = {
                "frames_agreeing": frame_agreement(turns["cpu"][k], turns["cuda"][k], w.size / 16000),
                "speakers_cpu": len({t.speaker for t in turns["cpu"][k]}),
                "speakers_cuda": len({t.speaker for t in turns["cuda"][k]})}
    for d in devices:
        for c in sorted({1, args.concurrency}):
            r = throughput(list(waves.values()), d, c, args.rounds)
            res["runs"].append(r)
            print(json.dumps(r), flush=True)
    print(json.dumps(res, indent=1))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
