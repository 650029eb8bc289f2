"""Fault injection against the real topologies (issue 17 item 8), shared by the CI suite
(``tests/faults/test_faults.py``) and the measurement script (``benchmarks/bench_faults.py``); the
topologies and their scaled-down settings are in :mod:`tests.faults.topology`.

One run (:func:`run_fault`, :func:`run_embedded_restart`): N jobs in flight (a 3 s clip, each with a
webhook), the fault injected, then every job polled until final or the recovery bound, and counted:
statuses, error codes, jobs still active, transcript objects per job in the store, webhook messages per job
at the receiver.
"""

from __future__ import annotations

import json
import signal
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx

from tests.faults.topology import FINAL, Cluster, Embedded
from tests.servers import wait_port


@dataclass
class FaultResult:
    """Counts of one fault run (what the suite asserts and faults_cpu.json records)."""

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
