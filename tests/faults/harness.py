"""Fault injection against the real topologies (issue 17 item 8), shared by the CI suite
(``tests/faults/test_faults.py``) and the measurement script (``benchmarks/bench_faults.py``).

Production: Postgres, Redis, moto's S3 server (this process), ``diarist engine`` (CPU, bundled tiny.en),
``diarist worker --class short`` and ``--class webhooks`` and ``diarist serve``, each its own process.
Embedded: ``diarist serve --embedded``. Settings are scaled down (leases of 4 s, sweeps every second) so a
fault resolves in seconds; the Redis visibility timeout stays at an hour, so no recovery comes from it.

One run (:func:`run_fault`): N jobs in flight (a 3 s clip, each with a webhook), the fault injected, then
every job polled until final or the recovery bound, and counted: statuses, error codes, jobs still active,
transcript objects per job in the store, webhook messages per job at the receiver.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import wave
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx
import numpy as np

from tests.servers import S3, Postgres, Receiver, Redis, free_port, wait_port

FINAL = ("completed", "failed", "canceled")
CLIP_S = 3.0
# Small bounds so a fault resolves in seconds (the defaults are minutes): a dead worker's job is re-driven
# within lease_s + sweep_interval_s = 5 s; a lost queued message within queued_redrive_s.
FAST = {"DIARIST_LEASE_S": "4", "DIARIST_SWEEP_INTERVAL_S": "1", "DIARIST_QUEUED_REDRIVE_S": "20",
        "DIARIST_ENGINE_RETRY_DELAY_S": "0.5", "DIARIST_OUTAGE_BACKOFF_MAX_S": "2", "DIARIST_OUTAGE_BOUND_S": "300",
        "DIARIST_ENGINE_ATTEMPTS": "3", "DIARIST_WEBHOOK_BACKOFF_S": "0.5", "DIARIST_VISIBILITY_TIMEOUT_S": "3600",
        "DIARIST_WEBHOOK_ALLOW_HOSTS": '["127.0.0.1"]', "DIARIST_ENGINE_KV_BUDGET_BYTES": str(256 << 20),
        "DIARIST_ENGINE_MAX_RUNNING_REQUESTS": "16", "OMP_NUM_THREADS": "1"}


def make_clip(src: Path, dest: Path, seconds: float = CLIP_S) -> Path:
    """The first ``seconds`` of ``src`` as 16 kHz mono 16-bit WAV (decoded with PyAV)."""
    import av

    with av.open(str(src)) as c:
        resampler = av.AudioResampler(format="s16", layout="mono", rate=16000)
        chunks = []
        for frame in c.decode(audio=0):
            for f in resampler.resample(frame):
                chunks.append(f.to_ndarray().reshape(-1))
            if sum(len(x) for x in chunks) >= seconds * 16000:
                break
    pcm = np.concatenate(chunks)[: int(seconds * 16000)].astype(np.int16)
    with wave.open(str(dest), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes(pcm.tobytes())
    return dest


class Proc:
    """A ``diarist`` subcommand in its own process group, its output appended to a log file."""

    def __init__(self, name: str, args: list[str], env: dict, logdir: Path) -> None:
        self.name, self.args, self.env, self.log = name, args, env, logdir / f"{name}.log"
        self.p: subprocess.Popen | None = None

    def start(self) -> Proc:
        out = open(self.log, "ab")  # noqa: SIM115 - the child owns it
        self.p = subprocess.Popen([sys.executable, "-m", "diarist.cli", *self.args], env=self.env, stdout=out,
                                  stderr=subprocess.STDOUT, start_new_session=True)
        out.close()
        return self

    def kill(self, sig: int = signal.SIGKILL, timeout_s: float = 60) -> None:
        if self.p is not None and self.p.poll() is None:
            os.killpg(self.p.pid, sig)
            try:
                self.p.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(self.p.pid, signal.SIGKILL)
                self.p.wait(timeout=30)

    def tail(self, n: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-n:] if self.log.exists() else ""


@dataclass
class FaultResult:
    """Counts of one fault run (what the suite asserts and faults.json records)."""

    fault: str
    jobs: int
    statuses: dict[str, int]
    error_codes: dict[str, int]
    stuck: int  # still queued/processing at the recovery bound
    recovered_s: float  # from the fault's end until every job was final
    transcripts_per_job: dict[str, int]  # {"1": n jobs with exactly one transcript object, ...}
    webhook_messages_per_job: dict[str, int]  # distinct webhook-ids per job
    webhook_posts: int  # POSTs received for these jobs (a redelivered id counts again)
    attempts: dict[str, int]
    final_at_fault: int = 0  # jobs already final when the fault was injected (the rest were in flight)
    submits_during_fault: dict[str, int] = field(default_factory=dict)  # "202" / "503 queue_unavailable"
    rows_from_refused_submits: int = 0

    def as_dict(self) -> dict:
        return asdict(self)


class Cluster:
    """The production topology on loopback (see the module doc). ``start()`` brings every server up."""

    def __init__(self, workdir: Path, short_concurrency: int = 4) -> None:
        self.workdir, self.logs = workdir, workdir / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.short_concurrency = short_concurrency
        self.pg = self.redis = self.s3 = None
        self.procs: dict[str, Proc] = {}
        self.receiver = Receiver()

    def start(self) -> Cluster:
        self.pg, self.redis, self.s3 = Postgres(), Redis(), S3()
        self.eport, self.aport = free_port(), free_port()
        env = {**os.environ, **FAST, "DIARIST_DATABASE_URL": self.pg.url, "DIARIST_BROKER_URL": self.redis.url,
               "DIARIST_STORAGE": "s3", "DIARIST_S3_ENDPOINT_URL": self.s3.url, "DIARIST_S3_BUCKET": "faults",
               "DIARIST_S3_CREATE_BUCKET": "true", "DIARIST_S3_ACCESS_KEY_ID": "t",
               "DIARIST_S3_SECRET_ACCESS_KEY": "t", "DIARIST_AUTH": "true",
               "DIARIST_ENGINE_URL": f"http://127.0.0.1:{self.eport}", "DIARIST_ENGINE_PORT": str(self.eport)}
        env.pop("DIARIST_EMBEDDED", None)
        self.env = env
        subprocess.run([sys.executable, "-m", "diarist.cli", "migrate"], env=env, check=True, capture_output=True)
        key = json.loads(subprocess.run([sys.executable, "-m", "diarist.cli", "keys", "create", "--name", "f",
                                         "--json"], env=env, check=True, capture_output=True, text=True).stdout)
        self.procs["engine"] = Proc("engine", ["engine"], env, self.logs).start()
        self.procs["short"] = Proc("short", ["worker", "--class", "short", "--concurrency",
                                             str(self.short_concurrency)], env, self.logs).start()
        self.procs["webhooks"] = Proc("webhooks", ["worker", "--class", "webhooks"], env, self.logs).start()
        self.procs["api"] = Proc("api", ["serve", "--port", str(self.aport)], env, self.logs).start()
        wait_port(self.aport, 120)
        wait_port(self.eport, 300)
        self.client = httpx.Client(base_url=f"http://127.0.0.1:{self.aport}", timeout=60,
                                   headers={"Authorization": f"Bearer {key['token']}"})
        return self

    def store_client(self):
        import boto3

        return boto3.client("s3", endpoint_url=self.s3.url, region_name="us-east-1", aws_access_key_id="t",
                            aws_secret_access_key="t")

    def transcripts(self, job_id: str) -> int:
        """Transcript objects of ``job_id`` in the bucket."""
        r = self.store_client().list_objects_v2(Bucket="faults", Prefix=f"jobs/{job_id}/transcript-")
        return int(r.get("KeyCount", 0))

    def restart_engine(self, down_s: float) -> None:
        self.procs["engine"].kill()
        time.sleep(down_s)
        self.procs["engine"].start()

    def diagnostics(self) -> str:
        return "\n".join(f"--- {n} ---\n{p.tail()}" for n, p in self.procs.items())

    def stop(self) -> None:
        if getattr(self, "client", None) is not None:
            self.client.close()
        for p in self.procs.values():
            p.kill(signal.SIGTERM, timeout_s=20)
        for server in (self.s3, self.redis, self.pg):
            if server is not None:
                server.stop()
        self.receiver.close()


class Embedded:
    """``diarist serve --embedded`` in its own process over a data dir that survives restarts."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        (workdir / "logs").mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.receiver = Receiver()
        env = {**os.environ, **FAST, "DIARIST_ENGINE_MAX_RUNNING_REQUESTS": "16", "DIARIST_SHORT_CONCURRENCY": "2",
               "DIARIST_LONG_CONCURRENCY": "1", "DIARIST_WEBHOOK_CONCURRENCY": "2"}
        for k in ("DIARIST_DATABASE_URL", "DIARIST_BROKER_URL", "DIARIST_STORAGE", "DIARIST_AUTH"):
            env.pop(k, None)
        self.proc = Proc("embedded", ["serve", "--embedded", "--port", str(self.port), "--data-dir",
                                      str(workdir / "data")], env, workdir / "logs")
        self.client = httpx.Client(base_url=f"http://127.0.0.1:{self.port}", timeout=60)

    def start(self) -> Embedded:
        self.proc.start()
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            try:
                if self.client.get("/healthz").status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise TimeoutError(f"embedded server did not start:\n{self.proc.tail()}")

    def transcripts(self, job_id: str) -> int:
        return len(list((self.workdir / "data" / "objects" / "jobs" / job_id).glob("transcript-*")))

    def diagnostics(self) -> str:
        return self.proc.tail()

    def stop(self) -> None:
        self.proc.kill(signal.SIGTERM)
        self.client.close()
        self.receiver.close()


def submit(client: httpx.Client, clip: Path, webhook_url: str) -> httpx.Response:
    with clip.open("rb") as f:
        return client.post("/v1/jobs", files={"file": (clip.name, f)}, data={"webhook_url": webhook_url})


def submit_n(target, clip: Path, n: int) -> list[str]:
    ids = []
    for _ in range(n):
        r = submit(target.client, clip, target.receiver.url)
        assert r.status_code == 202, r.text
        ids.append(r.json()["id"])
    return ids


def wait_processing(client: httpx.Client, ids: list[str], at_least: int = 1, timeout_s: float = 120.0) -> None:
    """Until ``at_least`` of ``ids`` are processing (so the fault hits running jobs, not only queued)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        running = sum(client.get(f"/v1/jobs/{i}").json()["status"] == "processing" for i in ids)
        if running >= at_least:
            return
        time.sleep(0.1)


def wait_final(client: httpx.Client, ids: list[str], bound_s: float) -> dict[str, dict]:
    """Poll until every job is final or ``bound_s`` passed (transient API errors are polled through)."""
    deadline = time.monotonic() + bound_s
    last: dict[str, dict] = {}
    while True:
        for i in ids:
            if last.get(i, {}).get("status") in FINAL:
                continue
            try:
                r = client.get(f"/v1/jobs/{i}")
                if r.status_code == 200:
                    last[i] = r.json()
            except httpx.HTTPError:
                pass
        if all(last.get(i, {}).get("status") in FINAL for i in ids) or time.monotonic() > deadline:
            return last
        time.sleep(0.25)


def count(target, fault: str, ids: list[str], jobs: dict[str, dict], fault_end: float, settle_s: float = 3.0,
          **extra) -> FaultResult:
    recovered = time.monotonic() - fault_end
    time.sleep(settle_s)  # a duplicate completion or webhook would arrive in this window
    mine = set(ids)
    per_job: dict[str, set[str]] = {i: set() for i in ids}
    posts = 0
    for headers, body in list(target.receiver.calls):
        jid = json.loads(body)["data"]["id"]
        if jid in mine:
            posts += 1
            per_job[jid].add(headers["webhook-id"])
    statuses = Counter(jobs.get(i, {}).get("status", "unknown") for i in ids)
    codes = Counter((jobs[i].get("error") or {}).get("code") for i in ids if jobs.get(i, {}).get("status") == "failed")
    return FaultResult(
        fault=fault, jobs=len(ids), statuses=dict(statuses), error_codes=dict(codes),
        stuck=sum(jobs.get(i, {}).get("status") not in FINAL for i in ids), recovered_s=round(recovered, 1),
        transcripts_per_job={str(k): v for k, v in Counter(target.transcripts(i) for i in ids).items()},
        webhook_messages_per_job={str(k): v for k, v in Counter(len(v) for v in per_job.values()).items()},
        webhook_posts=posts, attempts={str(k): v for k, v in Counter(jobs.get(i, {}).get("attempts") for i in ids).items()},
        **extra)


# -- the faults of issue 17's table ------------------------------------------------------------------------

def run_fault(cluster: Cluster, fault: str, clip: Path, n: int = 20, bound_s: float = 180.0) -> FaultResult:
    """Inject one production fault with ``n`` jobs in flight and count the outcome."""
    ids = submit_n(cluster, clip, n)
    wait_processing(cluster.client, ids, at_least=1)
    if fault == "short_worker_sigkill":
        wait_processing(cluster.client, ids, at_least=min(n, cluster.short_concurrency))
    extra: dict = {"final_at_fault": _final_now(cluster.client, ids)}
    if fault == "postgres_stopped_15s":
        cluster.pg.down()
        time.sleep(15)
        cluster.pg.up()
    elif fault == "s3_down_20s":
        cluster.s3.down()
        time.sleep(20)
        cluster.s3.up()
    elif fault == "engine_sigkill_back_in_10s":
        cluster.restart_engine(10)
        wait_port(cluster.eport, 300)
    elif fault == "redis_restarted_9s":
        rows_before = _rows_total(cluster)
        cluster.redis.down()
        t0 = time.monotonic()
        codes: Counter = Counter()
        for _ in range(3):  # clients keep submitting during the outage
            r = submit(cluster.client, clip, cluster.receiver.url)
            if r.status_code == 202:
                ids.append(r.json()["id"])
                codes["202"] += 1
            else:
                codes[f"{r.status_code} {r.json()['error']['code']} retry-after={r.headers.get('retry-after')}"] += 1
        time.sleep(max(0.0, 9 - (time.monotonic() - t0)))
        cluster.redis.up()
        extra["submits_during_fault"] = dict(codes)
        extra["rows_from_refused_submits"] = _rows_total(cluster) - rows_before - codes["202"]
    elif fault == "short_worker_sigkill":
        cluster.procs["short"].kill()
        cluster.procs["short"].start()
    else:
        raise ValueError(f"unknown fault {fault!r}")
    end = time.monotonic()
    jobs = wait_final(cluster.client, ids, bound_s)
    return count(cluster, fault, ids, jobs, end, **extra)


def _final_now(client: httpx.Client, ids: list[str]) -> int:
    return sum(client.get(f"/v1/jobs/{i}").json()["status"] in FINAL for i in ids)


def _rows_total(cluster: Cluster) -> int:
    from sqlalchemy import create_engine, text

    eng = create_engine(cluster.pg.url)
    try:
        with eng.connect() as c:
            return int(c.execute(text("SELECT count(*) FROM jobs")).scalar())
    finally:
        eng.dispose()


def run_embedded_restart(workdir: Path, clip: Path, sig: int, n: int = 20, bound_s: float = 240.0) -> FaultResult:
    """``serve --embedded`` stopped by ``sig`` with ``n`` jobs in flight, started again, outcome counted."""
    emb = Embedded(workdir).start()
    try:
        ids = submit_n(emb, clip, n)
        wait_processing(emb.client, ids, at_least=1)
        final_at_fault = _final_now(emb.client, ids)
        emb.proc.kill(sig)
        emb.start()
        end = time.monotonic()
        jobs = wait_final(emb.client, ids, bound_s)
        name = {signal.SIGKILL: "embedded_sigkill_restart", signal.SIGTERM: "embedded_sigterm_restart"}[sig]
        return count(emb, name, ids, jobs, end, final_at_fault=final_at_fault)
    finally:
        emb.stop()


def new_workdir() -> Path:
    return Path(tempfile.mkdtemp(prefix="diarist-faults-"))
