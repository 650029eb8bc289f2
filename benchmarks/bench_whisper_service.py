"""The Whisper family end to end on one GPU (issue 29 item 3): the service against the pipeline alone.

For each model (``--models``: ``tiny.en`` and ``base`` with their real weights, ``large-v3`` as Whisper
large-v3's shape on dummy weights for the engine part) and each workload, in one run on one device:

- **in-process** (the "engine alone" of the Whisper family): one :class:`transcription.transcriber.Transcriber`
  on the engine ``diarist engine`` would build (``Settings.engine_config``), the same recordings submitted from
  as many threads as the workload keeps in flight. Speech detection, the windows' decode, word alignment and
  the speaker stage all run, as in the engine server;
- **service** (the production topology): ``diarist engine`` (the real entry point), ``diarist worker`` for the
  short and the long class, and ``diarist serve`` as separate processes on loopback, jobs uploaded to
  ``POST /v1/jobs`` as 16-bit WAV and polled to completion (``bench_service_gpu.run_jobs``).

Workloads: **W-short**, ``--short-jobs`` (default 800) recordings of 12 s with 64 in flight; **W-38**, one
recording of 38 minutes. Audio: real multi-speaker speech (the shared data's phone call and AMI excerpts)
cut or tiled to length, with a seeded noise floor (std 1e-3) that makes every recording unique, so no cache
serves a repeat. With dummy weights the decode's output is whatever random weights produce (its token count
is reported); the speaker stage and speech detection run as for real weights.

Reported per model and workload: audio-s/s of both and their ratio (target: service >= 80% of in-process),
and where a job's seconds go (from the job rows: upload, Celery queue wait, worker fetch, engine call, and
inside it speech detection, diarization, encoder, prefill, decode, engine queue wait). How a long
recording's windows are batched: ``transcription/whisper/window_decoder.py`` submits every window of a
recording to the engine at once, so the engine decodes them as one batch (``windows_per_step`` below is the
engine's own running-request count sampled while W-38 decodes).

    python benchmarks/bench_whisper_service.py --data ../shared/data --device cpu --tiny   # CPU smoke (~2 min)
    bash scripts/gpu_tests.sh --bench-whisper -- --out $OUT/whisper_service_h100.json     # on the GPU machine
"""

from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import wave
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import service_topology as topo
from bench_service_gpu import db_rows, run_jobs

CLIPS = ["en_2spk_phonecall_pyannote_sample/sample.wav", "en_ami_meeting_dev00_2spk/dev00.wav",
         "en_ami_meeting_trn05_4spk/trn05.wav", "en_ami_meeting_trn07_4spk/trn07.wav"]
"""Multi-speaker speech the recordings are cut from (``--data``)."""
SR = 16_000
LARGE_V3 = {"d_model": 1280, "encoder_layers": 32, "decoder_layers": 32, "encoder_attention_heads": 20,
            "decoder_attention_heads": 20, "encoder_ffn_dim": 5120, "decoder_ffn_dim": 5120, "num_mel_bins": 128,
            "vocab_size": 51866}
"""Whisper large-v3's shape (its Hugging Face ``config.json``), for ``large-v3`` on dummy weights."""
TINY_SHAPE = {"d_model": 64, "encoder_layers": 1, "decoder_layers": 1, "encoder_attention_heads": 2,
              "decoder_attention_heads": 2, "encoder_ffn_dim": 128, "decoder_ffn_dim": 128, "num_mel_bins": 128,
              "vocab_size": 51866}
"""``--tiny``: large-v3's mel bins and vocabulary at a CPU-sized width and depth."""
MODELS = {"tiny.en": {"model_path": "tiny.en"}, "base": {"model_path": "base"},
          "large-v3": {"load_format": "dummy", "dummy_config": LARGE_V3}}


def model_settings(name: str, tiny: bool) -> dict:
    """``Settings.engine_config`` keyword arguments of ``name`` (``DIARIST_WHISPER_DIR`` stands for tiny.en's
    files where the machine has no package of them, as on the GPU machine)."""
    kw = dict(MODELS[name])
    if name == "large-v3" and tiny:
        kw["dummy_config"] = TINY_SHAPE
    if name == "tiny.en" and os.environ.get("DIARIST_WHISPER_DIR"):
        kw["model_path"] = os.environ["DIARIST_WHISPER_DIR"]
    return kw


def speech(data: Path) -> np.ndarray:
    """The clips of :data:`CLIPS` one after another, mono float32 at 16 kHz."""
    from transcription.audio import decode_audio

    return np.concatenate([decode_audio(str(data / c)).mono for c in CLIPS]).astype(np.float32)


def recording(source: np.ndarray, seconds: float, seed: int) -> np.ndarray:
    """``seconds`` of ``source`` from a seeded offset (tiled past its end) plus a seeded noise floor."""
    rng = np.random.default_rng(seed)
    n = int(seconds * SR)
    start = int(rng.integers(0, source.size))
    idx = (start + np.arange(n)) % source.size
    return (source[idx] + rng.standard_normal(n).astype(np.float32) * 1e-3).clip(-1, 1).astype(np.float32)


def wav(samples: np.ndarray) -> bytes:
    """16-bit mono WAV bytes of float samples in [-1, 1]."""
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(SR)
        w.writeframes((samples * 32767).astype("<i2").tobytes())
    return buf.getvalue()


def workloads(args: argparse.Namespace) -> dict[str, dict]:
    short = {"jobs": 6, "audio_s": 12.0, "concurrency": 3} if args.tiny else \
        {"jobs": args.short_jobs, "audio_s": 12.0, "concurrency": 64}
    long = {"jobs": 1, "audio_s": 150.0 if args.tiny else 38 * 60.0, "concurrency": 1}
    return {k: v for k, v in {"w-short": short, "w-38": long}.items() if k in args.workloads.split(",")}


def in_process(transcriber, source: np.ndarray, wl: dict, seed0: int, engine) -> dict:
    """The workload through ``transcriber`` from ``wl["concurrency"]`` threads; audio-s/s and the pipeline's
    mean timings per recording, plus the engine's running-request counts sampled every 50 ms."""
    from transcription.audio import DecodedAudio

    recs = [recording(source, wl["audio_s"], seed0 + i) for i in range(wl["jobs"])]
    running, stop = [], threading.Event()

    def sample() -> None:
        while not stop.wait(0.05):
            running.append(engine.stats().get("running_requests", 0))

    def one(x: np.ndarray) -> dict:
        r = transcriber.transcribe(DecodedAudio(samples=x[None, :], source_sample_rate=SR, source_channels=1,
                                                codec="pcm_s16le", container="wav"))
        return {**r.metrics.to_json(), **r.pipeline_metrics, "segments": len(r.segments),
                "speakers": len({s.speaker for s in r.segments})}

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    t0 = time.perf_counter()
    with ThreadPoolExecutor(wl["concurrency"]) as pool:
        rows = list(pool.map(one, recs))
    wall = time.perf_counter() - t0
    stop.set()
    out = {"wall_s": wall, "audio_s_per_s": wl["jobs"] * wl["audio_s"] / wall,
           "per_job_mean_s": _means(rows, ("processing_s", "vad_s", "diarization_s", "encoder_s", "prefill_s",
                                           "decode_s", "queue_wait_s")),
           "output_tokens_mean": float(np.mean([r.get("output_tokens") or 0 for r in rows])),
           "speakers_mean": float(np.mean([r["speakers"] for r in rows]))}
    if running:
        out["engine_running_requests_p50_max"] = [float(np.median(running)), float(max(running))]
    return out


def _means(rows: list[dict], keys: tuple[str, ...]) -> dict:
    return {k: float(np.mean(vals)) if (vals := [r[k] for r in rows if r.get(k) is not None]) else None
            for k in keys}


class WhisperService:
    """The production topology around ``diarist engine --model whisper``: every process a ``python -m cli``
    command, SQLite (WAL) and the local object store in a temporary folder, kombu's filesystem broker (or
    Redis when ``redis-server`` runs here)."""

    def __init__(self, args: argparse.Namespace, data_dir: Path, model: dict) -> None:
        import shutil

        self.dir, self.procs, self.args = data_dir, [], args
        self.engine_port, self.api_port = topo.free_port(), topo.free_port()
        self.redis = topo._runnable(shutil.which("redis-server"))
        broker = f"redis://127.0.0.1:{topo.free_port()}/0" if self.redis else "filesystem://"
        self.env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(topo.REPO), os.environ.get("PYTHONPATH", "")]),
                    "DIARIST_DATA_DIR": str(data_dir), "DIARIST_DATABASE_URL": f"sqlite:///{data_dir}/db.sqlite3",
                    "DIARIST_STORAGE": "local", "DIARIST_STORAGE_DIR": str(data_dir / "objects"),
                    "DIARIST_BROKER_URL": broker, "DIARIST_AUTH": "false", "DIARIST_MODEL": "whisper",
                    "DIARIST_ENGINE_URL": f"http://127.0.0.1:{self.engine_port}",
                    "DIARIST_ENGINE_MAX_RUNNING_REQUESTS": str(args.max_running)}
        self.engine_args = ["--model", "whisper", "--device", args.device, "--port", str(self.engine_port)]
        if "model_path" in model:
            self.engine_args += ["--model-path", model["model_path"]]
        if model.get("load_format") == "dummy":
            self.engine_args += ["--load-format", "dummy", "--dummy-config", json.dumps(model["dummy_config"])]
        self.describe = (f"production-shaped: diarist serve, diarist worker (short, long), diarist engine as "
                         f"processes over loopback HTTP; broker {broker.split(':')[0]}; SQLite")

    def _spawn(self, *cmd: str, log: str) -> subprocess.Popen:
        out = open(self.dir / f"{log}.log", "wb")  # noqa: SIM115 - closed with the process
        p = subprocess.Popen([sys.executable, "-m", "cli", *cmd], env=self.env, cwd=topo.REPO, stdout=out,
                             stderr=subprocess.STDOUT)
        self.procs.append(p)
        return p

    def start(self) -> str:
        if self.redis:
            port = self.env["DIARIST_BROKER_URL"].rsplit(":", 1)[1].split("/")[0]
            p = subprocess.Popen([self.redis, "--port", port, "--save", "", "--appendonly", "no"],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            self.procs.append(p)
        subprocess.run([sys.executable, "-m", "cli", "migrate"], env=self.env, cwd=topo.REPO, check=True,
                       capture_output=True)
        engine = self._spawn("engine", *self.engine_args, log="engine")
        topo._wait_http(f"{self.env['DIARIST_ENGINE_URL']}/health", engine, self.args.start_timeout)
        for klass in ("short", "long"):
            self._spawn("worker", "--class", klass, "--loglevel", "WARNING", log=f"worker-{klass}")
        api = self._spawn("serve", "--host", "127.0.0.1", "--port", str(self.api_port), log="api")
        url = f"http://127.0.0.1:{self.api_port}"
        topo._wait_http(f"{url}/readyz", api, 120)
        time.sleep(2.0)  # the workers' consumers: nothing answers for them
        return url

    def stop(self) -> None:
        topo.stop_processes(self.procs)

    def log_tails(self) -> dict:
        return {p.stem: p.read_text(errors="replace").splitlines()[-15:] for p in sorted(self.dir.glob("*.log"))}


def service(args: argparse.Namespace, model: dict, source: np.ndarray, wl: dict, seed0: int) -> dict:
    """The workload through ``POST /v1/jobs`` on :class:`WhisperService`; audio-s/s and where the seconds go."""
    with tempfile.TemporaryDirectory(prefix="diarist-wbench-") as d:
        svc = WhisperService(args, Path(d), model)
        try:
            url = svc.start()
            t0 = time.perf_counter()
            client = run_jobs(url, wl, seed0, args.poll_s, args.timeout,
                              body=lambda i: wav(recording(source, wl["audio_s"], seed0 + i)))
            wall = time.perf_counter() - t0
        finally:
            svc.stop()
        rows = db_rows(svc.env["DIARIST_DATABASE_URL"], list(client["submits"]))
        done = [r for r in rows if r["status"] == "completed"]
        out = {"describe": svc.describe, "wall_s": wall,
               "audio_s_per_s": len(done) * wl["audio_s"] / wall if done else 0.0,
               "completed": len(done), "lost": wl["jobs"] - len(done), "submit_errors": client["errors"][:3]}
        if done:
            start = {r["id"]: client["submits"][r["id"]] for r in done}
            per = [{**r, "upload_s": start[r["id"]][1] - start[r["id"]][0],
                    "celery_queue_wait_s": r["started_at"] - r["created_at"],
                    "job_latency_s": r["finished_at"] - start[r["id"]][0]} for r in done]
            out["per_job_mean_s"] = _means(per, ("upload_s", "celery_queue_wait_s", "worker_fetch_s", "worker_engine_s",
                                                 "processing_s", "vad_s", "diarization_s", "encoder_s", "prefill_s",
                                                 "decode_s", "queue_wait_s", "worker_store_s", "job_latency_s"))
        if out["lost"]:
            out["process_log_tails"] = svc.log_tails()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=os.environ.get("DIARIST_TEST_DATA", str(topo.REPO.parent / "shared" / "data")))
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--models", default="tiny.en,base,large-v3")
    ap.add_argument("--workloads", default="w-short,w-38")
    ap.add_argument("--short-jobs", type=int, default=800)
    ap.add_argument("--tiny", action="store_true", help="a handful of short jobs and a 150 s recording (CPU smoke)")
    ap.add_argument("--max-running", type=int, default=64)
    ap.add_argument("--poll-s", type=float, default=0.05)
    ap.add_argument("--timeout", type=float, default=420.0)
    ap.add_argument("--start-timeout", type=float, default=300.0)
    ap.add_argument("--commit", default="")
    ap.add_argument("--out", default="")
    args = ap.parse_args()

    import torch

    from diarist.settings import Settings
    from engine import Engine
    from transcription.transcriber import Transcriber

    cuda = args.device.startswith("cuda") and torch.cuda.is_available()
    commit = args.commit or subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                                           check=False, cwd=topo.REPO).stdout.strip()
    res = {"command": " ".join(sys.argv), "commit": commit, "device": torch.cuda.get_device_name() if cuda else "cpu",
           "torch": torch.__version__, "clips": CLIPS, "models": {}}
    save = lambda: args.out and Path(args.out).write_text(json.dumps(res, indent=1))
    source = speech(Path(args.data))
    failed = False
    for m, name in enumerate(n for n in args.models.split(",") if n):
        model = model_settings(name, args.tiny)
        for w, (wname, wl) in enumerate(workloads(args).items()):
            seed0 = 1_000_000 * (1 + 10 * m + w)
            entry = res["models"].setdefault(name, {}).setdefault(wname, {"workload": wl})
            try:  # the service first: its engine is a child process, which gives the GPU back when it exits
                entry["service"] = service(args, model, source, wl, seed0)
                engine = Engine(Settings(engine_max_running_requests=args.max_running).engine_config(
                    model="whisper", device=args.device, seed=0, **model))
                engine.start()
                try:
                    tr = Transcriber(engine)
                    in_process(tr, source, {**wl, "jobs": min(wl["jobs"], 4)}, seed0 + 500_000, engine)  # warm-up
                    entry["in_process"] = in_process(tr, source, wl, seed0, engine)
                finally:
                    engine.shutdown()
                    del engine
                    if cuda:
                        torch.cuda.empty_cache()
                entry["service_over_in_process"] = (entry["service"]["audio_s_per_s"]
                                                    / entry["in_process"]["audio_s_per_s"])
                failed |= bool(entry["service"]["lost"])
            except Exception as e:  # noqa: BLE001 - the other models still run; the error is in the result
                entry["error"] = f"{type(e).__name__}: {e}"
                failed = True
            print(name, wname, json.dumps({k: (v.get("audio_s_per_s") if isinstance(v, dict) else v)
                                           for k, v in entry.items() if k != "workload"}), flush=True)
            save()
    save()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
