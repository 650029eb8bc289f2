"""Service load benchmark: N short jobs from C concurrent HTTP clients against the real stack, loopback only.

Default: 500 jobs of a 1 s recording from 50 clients on the embedded stack (API + Celery in-memory broker
with worker threads + SQLite + local store + the bundled tiny.en on CPU), the same code paths as the
production processes.

Reports (JSON on stdout and in ``--out``): submit latency p50/p99 (seconds, POST /v1/jobs until 202),
end-to-end throughput (jobs/s and audio s/s from the first submit to the last completion), lost jobs (not
completed), duplicated jobs (completed more than once: a second transcript object or attempts > 1 without
a crash), plus the command and commit. Bounded: every loop stops at --timeout seconds.

    .venv/bin/python benchmarks/bench_service_load.py --jobs 500 --clients 50 --out benchmarks/results/...
"""

from __future__ import annotations

import argparse
import json
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
DEFAULT_AUDIO = REPO.parent / "shared" / "data" / "en_short_yes" / "yes_1000ms.wav"
FINAL = ("completed", "failed", "canceled")


def percentile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q * (len(xs) - 1)))]


def run_load(base_url: str, audio: bytes, n_jobs: int, clients: int, timeout_s: float,
             headers: dict | None = None) -> dict:
    latencies: list[float] = []
    ids: list[str] = []
    errors: list[str] = []
    t_start = time.monotonic()

    def one(i: int) -> None:
        with httpx.Client(base_url=base_url, timeout=120, headers=headers or {}) as c:
            t0 = time.monotonic()
            r = c.post("/v1/jobs", files={"file": (f"load-{i}.wav", audio)})
            latencies.append(time.monotonic() - t0)
            if r.status_code == 202:
                ids.append(r.json()["id"])
            else:
                errors.append(f"{r.status_code}: {r.text[:200]}")

    with ThreadPoolExecutor(clients) as pool:
        list(pool.map(one, range(n_jobs)))
    t_submitted = time.monotonic()
    deadline = t_start + timeout_s
    final: dict[str, dict] = {}
    with httpx.Client(base_url=base_url, timeout=60, headers=headers or {}) as c:
        while len(final) < len(ids) and time.monotonic() < deadline:
            for job_id in ids:
                if job_id not in final:
                    j = c.get(f"/v1/jobs/{job_id}").json()
                    if j["status"] in FINAL:
                        final[job_id] = j
            time.sleep(0.5)
    t_done = time.monotonic()
    done = [j for j in final.values() if j["status"] == "completed"]
    audio_s = sum(j["duration"] for j in done)
    wall = t_done - t_start
    return {
        "jobs_submitted": len(ids), "submit_errors": len(errors), "submit_error_samples": errors[:3],
        "jobs_completed": len(done), "jobs_failed": sum(1 for j in final.values() if j["status"] == "failed"),
        "lost": len(ids) - len(done), "duplicated_ids": len(ids) - len(set(ids)),
        "retried_attempts": sum(1 for j in done if j["attempts"] != 1),
        "submit_latency_s": {"p50": percentile(latencies, 0.5), "p99": percentile(latencies, 0.99),
                             "max": max(latencies), "mean": statistics.fmean(latencies)},
        "submit_phase_s": t_submitted - t_start, "wall_s": wall,
        "throughput_jobs_per_s": len(done) / wall if wall else 0.0,
        "throughput_audio_s_per_s": audio_s / wall if wall else 0.0,
        "rtf_p50": percentile([j["metrics"]["rtf"] for j in done], 0.5) if done else None,
    }


def count_transcripts(objects_dir: Path) -> dict[str, int]:
    """Transcript objects per job in a local store (more than one = a duplicated completion)."""
    out: dict[str, int] = {}
    for p in objects_dir.glob("jobs/*/transcript-*.json"):
        out[p.parent.name] = out.get(p.parent.name, 0) + 1
    return out


def embedded(args: argparse.Namespace, audio: bytes) -> dict:
    from cli.commands.stack import EmbeddedStack, embedded_settings

    with tempfile.TemporaryDirectory(prefix="diarist-load-") as d:
        st = embedded_settings(data_dir=d, short_concurrency=args.workers, long_concurrency=1,
                               webhook_concurrency=1)
        stack = EmbeddedStack(st).start()
        try:
            url = stack.serve_in_thread()
            result = run_load(url, audio, args.jobs, args.clients, args.timeout)
        finally:
            stack.stop()
        per_job = count_transcripts(Path(d) / "objects")
        result["duplicated_completions"] = sum(1 for n in per_job.values() if n > 1)
        result["topology"] = f"embedded (one process, {args.workers} worker threads)"
        return result


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--jobs", type=int, default=500)
    p.add_argument("--clients", type=int, default=50)
    p.add_argument("--workers", type=int, default=8, help="transcription worker threads")
    p.add_argument("--audio", default=str(DEFAULT_AUDIO))
    p.add_argument("--timeout", type=float, default=1800.0)
    p.add_argument("--out", default=None)
    args = p.parse_args()
    audio = Path(args.audio).read_bytes()
    result = embedded(args, audio)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True,
                            check=False).stdout.strip()
    report = {"benchmark": "service_load", "command": shlex.join([Path(sys.executable).name, *sys.argv]),
              "commit": commit, "machine": {"cpus": __import__("os").cpu_count(), "platform": platform.platform()},
              "audio": Path(args.audio).name, "jobs": args.jobs, "clients": args.clients, **result}
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text + "\n")
    return 0 if result["lost"] == 0 and result.get("duplicated_completions", 0) == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
