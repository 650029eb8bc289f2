"""Service benchmark (issue 16 item 6): the whole service on one GPU, MOSS-TD full-size dummy weights, fixed
output lengths, jobs submitted over HTTP to ``POST /v1/jobs`` and polled to completion, in two topologies
(``service_topology.py``): embedded (one process) and production-shaped (API, Celery workers and the engine
server as separate processes over loopback HTTP).

Workloads (the engine benchmark's, ``bench_engine.WORKLOADS``): W-short 800 x 12 s, 60 output tokens, 64 in
flight; W-long 16 x 38 min, 10,260 tokens, 16 in flight (``--tokens w-long=N`` shortens it; the missing decode
steps are projected with ``bench_engine.project_steps_s`` and added to the engine and the service alike).
For each workload and topology, in the same run and on the same engine: the engine-only figure from
``bench_engine.run_workload`` (inline stepping, before the service starts), the service figure, where the
difference goes per job (from the database: Celery queue wait, the worker's fetch / engine call / store,
audio decode, the engine's queue wait and wall; the upload from the client), and checks: no job lost or
duplicated, and the per-job metrics in the database equal the engine's own record of the job's sequence.

Audio: 16 kHz int16 WAV noise made in memory per job (unique per job, so the encoder cache never serves
one), dropped after its upload. Fixed output length: the transcriber's benchmark-only switch
(``Transcriber(fixed_output_tokens=N)``, refused unless the weights are dummy MOSS-TD), set on the instance
the engine server / embedded stack builds: never in a request.

Scale-out (``--engines 1,2``, issue 22 item 5): the production-shaped topology again with N engine servers,
one per GPU (``cuda:0`` … ``cuda:N-1``), each with its worker set (docs/operations.md, "Several GPUs, several
hosts"), the workload per GPU: N times the jobs and N times the jobs in flight. Results under
``production-<N>gpu``, and ``scaling``: each N's service audio-s/s over N = 1's, same run (target for
N = 2: 1.9).

    bash scripts/gpu_tests.sh --bench -- --out $OUT/service_gpu_h200.json  # on the GPU machine
    bash scripts/gpu_tests.sh --bench -- --engines 1,2 --topologies production --out $OUT/service_gpu_h200x2.json
    python benchmarks/bench_service_gpu.py --device cpu --tiny              # CPU smoke, both topologies
    python benchmarks/bench_service_gpu.py --device cpu --tiny --topologies production --engines 1,2
"""

from __future__ import annotations

import argparse
import io
import itertools
import json
import subprocess
import sys
import tempfile
import threading
import time
import wave
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import service_topology as topo

WORKLOADS = {"w-short": "w-short-c64", "w-long": "w-long-c16"}
"""Our workloads by their ``bench_engine.WORKLOADS`` names (requests, audio s, output tokens, concurrency)."""
TINY = {"w-short": {"jobs": 6, "audio_s": 2.0, "tokens": 8, "concurrency": 3},
        "w-long": {"jobs": 2, "audio_s": 130.0, "tokens": 6, "concurrency": 2}}
"""``--tiny``: a handful of jobs on the tiny dummy model; the long clips are past the 120 s class threshold."""
FINAL = ("completed", "failed", "canceled")


def wav_bytes(seconds: float, seed: int) -> bytes:
    """``seconds`` of 16 kHz mono int16 noise (std 0.1 full scale) as a WAV file."""
    samples = (np.random.default_rng(seed).standard_normal(int(seconds * 16_000)) * 3277).astype("<i2")
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16_000)
        w.writeframes(samples.tobytes())
    return buf.getvalue()


def run_jobs(url: str, wl: dict, seed0: int, poll_s: float, timeout_s: float,
             body: Callable[[int], bytes] | None = None) -> dict:
    """Keep ``wl["concurrency"]`` jobs in flight until ``wl["jobs"]`` were submitted and are final.

    Job ``i`` uploads ``body(i)`` (WAV bytes; default ``wav_bytes(wl["audio_s"], seed0 + i)``, noise).

    Submitter threads upload (``POST /v1/jobs``) when a slot is free; one poller lists the active jobs
    (``GET /v1/jobs?status=queued|processing``) every ``poll_s`` and confirms each job that left the list
    with ``GET /v1/jobs/{id}``, freeing its slot. Returns the client's view: per job id the submit start and
    end (epoch s) and its final JSON, plus submit errors.
    """
    slots, lock, counter = threading.Semaphore(wl["concurrency"]), threading.Lock(), itertools.count()
    pending: dict[str, tuple[float, float]] = {}
    submits: dict[str, tuple[float, float]] = {}
    finals: dict[str, dict] = {}
    errors: list[str] = []
    deadline = time.monotonic() + timeout_s

    def submitter() -> None:
        with httpx.Client(base_url=url, timeout=timeout_s) as c:
            while (i := next(counter)) < wl["jobs"] and time.monotonic() < deadline:
                slots.acquire()
                upload = body(i) if body is not None else wav_bytes(wl["audio_s"], seed0 + i)
                t0 = time.time()
                r = c.post("/v1/jobs", files={"file": (f"bench-{i}.wav", upload, "audio/wav")})
                t1 = time.time()
                with lock:
                    if r.status_code == 202:
                        pending[r.json()["id"]] = submits[r.json()["id"]] = (t0, t1)
                    else:
                        errors.append(f"{r.status_code}: {r.text[:200]}")
                        slots.release()

    threads = [threading.Thread(target=submitter, daemon=True) for _ in range(min(8, wl["concurrency"]))]
    for t in threads:
        t.start()
    with httpx.Client(base_url=url, timeout=60) as c:
        while time.monotonic() < deadline and (any(t.is_alive() for t in threads) or pending):
            active: set[str] = set()
            for status in ("queued", "processing"):
                cursor = None
                while True:
                    page = c.get("/v1/jobs", params={"status": status, "limit": 200,
                                                     **({"cursor": cursor} if cursor else {})}).json()
                    active |= {j["id"] for j in page["data"]}
                    if not page["has_more"]:
                        break
                    cursor = page["next_cursor"]
            with lock:
                gone = [j for j in pending if j not in active]
            for job_id in gone:
                j = c.get(f"/v1/jobs/{job_id}").json()
                if j["status"] in FINAL:
                    with lock:
                        finals[job_id] = j
                        del pending[job_id]
                    slots.release()
            time.sleep(poll_s)
    return {"submits": submits, "finals": finals, "errors": errors, "timed_out": bool(pending)}


def epoch(dt: datetime | None) -> float | None:
    """Seconds since the epoch of a row's UTC timestamp (SQLite hands them back naive)."""
    return None if dt is None else (dt if dt.tzinfo else dt.replace(tzinfo=UTC)).timestamp()


def db_rows(db_url: str, ids: list[str]) -> list[dict]:
    """Per job: the row's timestamps (epoch s), attempts, status and its metrics row (with ``extra``)."""
    from diarist.db import Database
    from diarist.models import Job

    db = Database(db_url)
    out = []
    with db.session() as s:
        for job in s.query(Job).filter(Job.id.in_(ids)):
            m = job.metrics
            ts = {k: epoch(getattr(job, k)) for k in ("created_at", "started_at", "finished_at")}
            metrics = {k: getattr(m, k) for k in ("queue_wait_s", "encoder_s", "prefill_s", "decode_s",
                                                  "prompt_tokens", "output_tokens", "processing_s", "rtf",
                                                  "engine_id")} if m else {}
            out.append({"id": job.id, "status": job.status, "attempts": job.attempts, "duration_s": job.duration_s,
                        **ts, **metrics, **((m.extra or {}) if m else {})})
    db.dispose()
    return out


KEYS = ("encoder_s", "prefill_s", "decode_s", "prompt_tokens", "output_tokens")


def analyse(wl: dict, client: dict, rows: list[dict], seqs: list[dict], engine: dict, objects: Path) -> dict:
    """The service figure, where its time goes per job, and the loss / duplication / metrics checks."""
    from bench_service_load import count_transcripts

    done = [r for r in rows if r["status"] == "completed"]
    t0 = min(t for t, _ in client["submits"].values())
    wall = max(r["finished_at"] for r in done) - t0 if done else float("nan")
    by_key = {}
    for s in seqs:
        by_key.setdefault(tuple(s[k] for k in KEYS), []).append(s)
    matched = []
    for r in done:  # the database's numbers are the engine's own for the same sequence, exactly
        cands = by_key.get(tuple(r[k] for k in KEYS))
        if cands:
            matched.append((r, cands.pop()))

    def mean(xs) -> float | None:
        xs = [x for x in xs if x is not None]
        return float(np.mean(xs)) if xs else None

    per_job = {
        "upload_submit_s": mean(t1 - t0_ for t0_, t1 in client["submits"].values()),
        "celery_queue_wait_s": mean(r["started_at"] - r["created_at"] for r in done),
        "worker_fetch_audio_s": mean(r.get("worker_fetch_s") for r in done),
        "worker_engine_call_s": mean(r.get("worker_engine_s") for r in done),
        "http_stream_overhead_s": mean(r["worker_engine_s"] - r["processing_s"] - r.get("worker_decode_s", 0.0)
                                       for r in done if "worker_engine_s" in r),
        "audio_decode_s": mean(r.get("audio_decode_s", 0.0) + r.get("worker_decode_s", 0.0) for r in done),
        "audio_decode_in_worker_s": mean(r.get("worker_decode_s") for r in done),
        "engine_queue_wait_s": mean(r["queue_wait_s"] for r in done),
        "engine_wall_s": mean(s["wall_s"] for _, s in matched),
        "transcriber_other_s": mean(r["processing_s"] - r.get("audio_decode_s", 0) - s["wall_s"] for r, s in matched),
        "worker_store_result_s": mean(r.get("worker_store_s") for r in done),
        "worker_other_s": mean(r["finished_at"] - r["started_at"] - r["worker_engine_s"] - r["worker_fetch_s"]
                               - r["worker_store_s"] for r in done if "worker_engine_s" in r),
        "job_latency_s": mean(r["finished_at"] - client["submits"][r["id"]][0] for r in done),
    }
    audio = len(done) * wl["audio_s"]
    out = {"jobs": wl["jobs"], "audio_s": wl["audio_s"], "output_tokens": wl["tokens"],
           "concurrency": wl["concurrency"], "wall_s": wall, "engine_audio_s_per_s": engine["audio_s_per_s"],
           "service_audio_s_per_s": audio / wall if done else 0.0,
           "lost": wl["jobs"] - len(done), "submit_errors": client["errors"][:3], "timed_out": client["timed_out"],
           "not_completed": [{k: r[k] for k in ("id", "status", "attempts", "started_at")} for r in rows
                             if r["status"] != "completed"][:5],
           "duplicated": sum(n > 1 for n in count_transcripts(objects).values()) + sum(r["attempts"] != 1 for r in done),
           "engine_sequences": len(seqs), "metrics_match_engine": f"{len(matched)}/{len(done)}",
           "jobs_with_fixed_output_tokens": sum(r["output_tokens"] == wl["tokens"] for r in done),
           "rtf_db_mean": mean(r["rtf"] for r in done), "rtf_engine_mean": mean(s["wall_s"] / s["audio_s"] for s in seqs),
           "worker_engine_share": mean(r["worker_engine_s"] / (r["finished_at"] - r["started_at"]) for r in done
                                       if "worker_engine_s" in r),
           "per_job_mean_s": per_job, "engine_only": engine}
    if "projected_extra_decode_s" in engine:  # shortened run: the missing steps cost both the same
        extra = engine["projected_extra_decode_s"]
        out["projected_full_tokens"] = engine["full_output_tokens"]
        out["projected_engine_audio_s_per_s"] = wl["jobs"] * wl["audio_s"] / (engine["wall_s"] + extra)
        out["projected_service_audio_s_per_s"] = audio / (wall + extra) if done else 0.0
    out["service_over_engine"] = out["service_audio_s_per_s"] / out["engine_audio_s_per_s"]
    return out


def per_gpu(wl: dict, engines: int) -> dict:
    """``wl`` (one GPU's workload) for ``engines`` GPUs: ``engines`` times the jobs and the jobs in flight."""
    return {**wl, "jobs": wl["jobs"] * engines, "concurrency": wl["concurrency"] * engines}


def runs(topologies: str, engines: str) -> list[tuple[str, int]]:
    """``(topology, engines)`` in run order: production first (its engines live in child processes, which
    give the GPU memory back when they exit; the embedded engine lives here), each production run for every
    count of ``engines``; embedded (one engine in this process) only when 1 is among them.

    >>> runs("embedded,production", "1,2")
    [('production', 1), ('production', 2), ('embedded', 1)]
    """
    counts = sorted({int(n) for n in engines.split(",") if n})
    if not counts or counts[0] < 1:
        raise ValueError(f"--engines {engines!r}: counts of engine servers, at least 1")
    names = sorted({t for t in topologies.split(",") if t}, key=lambda t: t != "production")
    return [(t, n) for t in names for n in (counts if t == "production" else [1] if 1 in counts else [])]


def scaling(result: dict, one: dict) -> dict:
    """``result``'s service throughput over the one-engine run's (``one``), measured and, for a shortened
    run, projected to the full output length."""
    out = {}
    for k in ("service_audio_s_per_s", "projected_service_audio_s_per_s"):
        if one.get(k) and k in result:
            out[k.removesuffix("_audio_s_per_s") + "_over_one_engine"] = result[k] / one[k]
    return out


def result_key(topology: str, engines: int) -> str:
    """``production`` / ``embedded`` at one engine (the keys of earlier results), ``production-<N>gpu`` above."""
    return topology if engines == 1 else f"{topology}-{engines}gpu"


def workload(name: str, args: argparse.Namespace) -> dict:
    from bench_engine import WORKLOADS as ENGINE_WORKLOADS

    n, audio_s, tokens, conc = ENGINE_WORKLOADS[WORKLOADS[name]]
    wl = dict(TINY[name]) if args.tiny else {"jobs": n, "audio_s": audio_s, "tokens": tokens, "concurrency": conc}
    for key, over in (("jobs", args.jobs), ("tokens", args.tokens), ("audio_s", args.audio_s)):
        if name in over:
            wl[key] = type(wl[key])(over[name])
    wl["full_tokens"] = wl["tokens"] if args.tiny else max(tokens, wl["tokens"])
    return wl


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tiny", action="store_true", help="tiny dummy MOSS-TD and a handful of jobs (CPU smoke)")
    ap.add_argument("--topologies", default="production,embedded", help="run in this order: production first")
    ap.add_argument("--workloads", default="w-short,w-long")
    over = lambda s: dict(kv.split("=") for kv in s.split(",") if kv)
    ap.add_argument("--jobs", type=over, default={}, help="e.g. w-long=4")
    ap.add_argument("--tokens", type=over, default={}, help="e.g. w-long=1000 (projected to the full length)")
    ap.add_argument("--audio-s", type=over, default={}, help="e.g. w-short=12")
    ap.add_argument("--broker", choices=("auto", "redis", "filesystem"), default="auto",
                    help="production topology's broker (auto: redis when redis-server is on the PATH)")
    ap.add_argument("--max-running", type=int, default=64, help="engine rows (DIARIST_ENGINE_MAX_RUNNING_REQUESTS)")
    ap.add_argument("--worker-processes", type=int, default=1,
                    help="production: `diarist worker` processes per transcription class, sharing its threads")
    ap.add_argument("--api-workers", type=int, default=1, help="production: `diarist serve --workers`")
    ap.add_argument("--engines", default="1", help="production: engine servers, one per GPU, each with its worker "
                    "set; a list (1,2) runs each count, the workload per GPU")
    ap.add_argument("--poll-s", type=float, default=0.05)
    ap.add_argument("--timeout", type=float, default=420.0,
                    help="per workload and topology (s): jobs not final by then count as lost")
    ap.add_argument("--start-timeout", type=float, default=600.0, help="engine server start, warm-up included")
    ap.add_argument("--commit", default="")
    ap.add_argument("--out", default="")
    ap.add_argument("--serve-engine", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--workload", default="{}", help=argparse.SUPPRESS)
    ap.add_argument("--engine-only-out", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve_engine:
        topo.serve_engine(args)
        return 0

    import torch

    from engine import Engine

    cuda = args.device.startswith("cuda") and torch.cuda.is_available()
    commit = args.commit or subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                                           check=False, cwd=topo.REPO).stdout.strip()
    res = {"command": " ".join(sys.argv), "commit": commit, "device": torch.cuda.get_device_name() if cuda else "cpu",
           "torch": torch.__version__, "tiny": args.tiny,
           "fixed_output_switch": "Transcriber(fixed_output_tokens=N) on the engine server's / embedded stack's "
           "transcriber instance, refused unless the weights are dummy MOSS-TD; not a request field",
           "topologies": {}, "workloads": {}}
    save = lambda: args.out and Path(args.out).write_text(json.dumps(res, indent=1))
    names = [w for w in args.workloads.split(",") if w]
    plan = runs(args.topologies, args.engines)
    embedded_engine = None
    for t_name, n_engines in plan:
        if t_name == "embedded" and embedded_engine is None:
            embedded_engine = Engine(topo.engine_config(args.device, args.tiny, args.max_running))
        engine = embedded_engine if t_name == "embedded" else None
        key = result_key(t_name, n_engines)
        for i, name in enumerate(names):
            base = workload(name, args)
            wl = per_gpu(base, n_engines)
            with tempfile.TemporaryDirectory(prefix="diarist-bench-") as d:
                data = Path(d)
                if engine is not None:
                    engine_stats = topo.engine_only(engine, wl)
                    t = topo.Embedded(engine, data, wl["tokens"])
                else:
                    t = topo.Production(args, data, base, engines=n_engines)
                try:
                    url = t.start()
                    if engine is None:
                        engine_stats = t.engine_only()
                    client = run_jobs(url, wl, seed0=1_000_000 * (i + 1), poll_s=args.poll_s, timeout_s=args.timeout)
                    seqs = t.sequences()
                finally:
                    t.stop()
                db_url = t.settings.db_url if engine is not None else t.env["DIARIST_DATABASE_URL"]
                rows = db_rows(db_url, list(client["submits"]))
                res["topologies"][key] = t.describe
                result = analyse(wl, client, rows, seqs, engine_stats, data / "objects")
                result["engines"] = n_engines
                if n_engines > 1:
                    result["jobs_per_engine"] = dict(Counter(r.get("engine_id") for r in rows))
                if result["lost"] and engine is None:  # what the processes said, before their folder goes
                    result["process_log_tails"] = {p.stem: p.read_text(errors="replace").splitlines()[-15:]
                                                   for p in sorted(data.glob("*.log"))}
            res["workloads"].setdefault(name, {})[key] = result
            one = res["workloads"][name].get(result_key(t_name, 1))
            if n_engines > 1 and one is not None:
                res.setdefault("scaling", {}).setdefault(name, {})[str(n_engines)] = scaling(result, one)
            print(name, key, json.dumps({k: result[k] for k in ("engine_audio_s_per_s", "service_audio_s_per_s",
                                                                  "service_over_engine", "lost", "duplicated",
                                                                  "metrics_match_engine")}), flush=True)
            save()
    del embedded_engine
    if cuda:
        torch.cuda.empty_cache()
    print(json.dumps(res, indent=1))
    save()
    bad = [(w, t) for w, ts in res["workloads"].items() for t, r in ts.items()
           if r["lost"] or r["duplicated"] or r["metrics_match_engine"].split("/")[0] != str(r["jobs"])]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
