"""The topologies the fault suite runs (issue 17 item 8): production on loopback and ``serve --embedded``.

Production: Postgres, Redis, moto's S3 server (this process), ``diarist engine`` (CPU, bundled tiny.en),
``diarist worker --class short`` and ``--class webhooks`` and ``diarist serve``, each its own process.
Embedded: ``diarist serve --embedded`` over a data dir that survives restarts. Settings are scaled down
(:data:`FAST`: leases of 4 s, sweeps every second) so a fault resolves in seconds; the Redis visibility
timeout stays at an hour, so no recovery comes from it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

from tests.conftest import pcm16_wav
from tests.servers import S3, Postgres, Receiver, Redis, free_port, wait_port

REPO = Path(__file__).resolve().parents[2]
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
    dest.write_bytes(pcm16_wav(np.concatenate(chunks)[: int(seconds * 16000)].astype(np.int16)))
    return dest


class Proc:
    """A ``diarist`` subcommand in its own process group, its output appended to a log file."""

    def __init__(self, name: str, args: list[str], env: dict, logdir: Path, module: str = "cli.main") -> None:
        self.name, self.args, self.env, self.log = name, args, env, logdir / f"{name}.log"
        self.module = module  # run as ``python -m module *args``
        self.p: subprocess.Popen | None = None

    def start(self) -> Proc:
        out = open(self.log, "ab")  # noqa: SIM115 - the child owns it
        self.p = subprocess.Popen([sys.executable, "-m", self.module, *self.args], env=self.env, stdout=out,
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


class LoopbackStack:
    """What the production-shaped topologies share: Postgres, Redis and moto's S3 on loopback, the ``diarist``
    processes (:class:`Proc`, by name in ``procs``) with their logs under ``workdir/logs``, and an API client
    with an API key. A subclass's ``start()`` brings its processes up over :meth:`service_env`; ``stop()``
    takes everything down."""

    bucket = "faults"
    """The S3 bucket the stack's object store uses."""
    tail_chars = 3000
    """How much of each process's log :meth:`diagnostics` shows (characters)."""

    def __init__(self, workdir: Path) -> None:
        self.workdir, self.logs = workdir, workdir / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.pg = self.redis = self.s3 = None
        self.procs: dict[str, Proc] = {}
        self.client: httpx.Client | None = None

    def service_env(self) -> dict[str, str]:
        """Start Postgres, Redis and S3; returns the environment every ``diarist`` process of the stack shares
        (:data:`FAST`, the three servers, auth on), also kept as ``self.env`` (a subclass adds its own keys to
        it before :meth:`api_token` and its processes read it)."""
        self.pg, self.redis, self.s3 = Postgres(), Redis(), S3()
        env = {**os.environ, **FAST, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
               "DIARIST_DATABASE_URL": self.pg.url, "DIARIST_BROKER_URL": self.redis.url, "DIARIST_STORAGE": "s3",
               "DIARIST_S3_ENDPOINT_URL": self.s3.url, "DIARIST_S3_BUCKET": self.bucket,
               "DIARIST_S3_CREATE_BUCKET": "true", "DIARIST_S3_ACCESS_KEY_ID": "t", "DIARIST_S3_SECRET_ACCESS_KEY": "t",
               "DIARIST_AUTH": "true"}
        env.pop("DIARIST_EMBEDDED", None)
        self.env = env
        return env

    def api_token(self) -> str:
        """``diarist migrate`` then ``diarist keys create`` under ``self.env``; returns the new key's token."""
        def cli(*args: str) -> str:
            return subprocess.run([sys.executable, "-m", "cli", *args], env=self.env, check=True,
                                  capture_output=True, text=True, cwd=REPO).stdout

        cli("migrate")
        return json.loads(cli("keys", "create", "--name", "tests", "--json"))["token"]

    def connect(self, api_port: int, token: str) -> None:
        """The API client (``self.client``) for the API on ``api_port``, authenticated with ``token``."""
        self.client = httpx.Client(base_url=f"http://127.0.0.1:{api_port}", timeout=60,
                                   headers={"Authorization": f"Bearer {token}"})

    def store_client(self):
        import boto3

        return boto3.client("s3", endpoint_url=self.s3.url, region_name="us-east-1", aws_access_key_id="t",
                            aws_secret_access_key="t")

    def transcripts(self, job_id: str) -> int:
        """Transcript objects of ``job_id`` in the bucket."""
        r = self.store_client().list_objects_v2(Bucket=self.bucket, Prefix=f"jobs/{job_id}/transcript-")
        return int(r.get("KeyCount", 0))

    def diagnostics(self) -> str:
        return "\n".join(f"--- {n} ---\n{p.tail(self.tail_chars)}" for n, p in self.procs.items())

    def stop(self) -> None:
        if self.client is not None:
            self.client.close()
        for p in self.procs.values():
            p.kill(signal.SIGTERM, timeout_s=20)
        for server in (self.s3, self.redis, self.pg):
            if server is not None:
                server.stop()


class Cluster(LoopbackStack):
    """The production topology on loopback (see the module doc). ``start()`` brings every server up."""

    def __init__(self, workdir: Path, short_concurrency: int = 4) -> None:
        super().__init__(workdir)
        self.short_concurrency = short_concurrency
        self.receiver = Receiver()

    def start(self) -> Cluster:
        self.eport, self.aport = free_port(), free_port()
        env = self.service_env()
        env.update({"DIARIST_ENGINE_URL": f"http://127.0.0.1:{self.eport}", "DIARIST_ENGINE_PORT": str(self.eport)})
        token = self.api_token()
        self.procs["engine"] = Proc("engine", ["engine"], env, self.logs).start()
        self.procs["short"] = Proc("short", ["worker", "--class", "short", "--concurrency",
                                             str(self.short_concurrency)], env, self.logs).start()
        self.procs["webhooks"] = Proc("webhooks", ["worker", "--class", "webhooks"], env, self.logs).start()
        self.procs["api"] = Proc("api", ["serve", "--port", str(self.aport)], env, self.logs).start()
        wait_port(self.aport, 120)
        wait_port(self.eport, 300)
        self.connect(self.aport, token)
        return self

    def restart_engine(self, down_s: float) -> None:
        self.procs["engine"].kill()
        time.sleep(down_s)
        self.procs["engine"].start()

    def stop(self) -> None:
        super().stop()
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


def new_workdir() -> Path:
    return Path(tempfile.mkdtemp(prefix="diarist-faults-"))
