"""The service under test for ``bench_service_gpu.py``: the engine it runs, the engine server process, and the
two topologies (embedded: one process; production-shaped: API, workers and engine server as processes).

The fixed output length (``--fixed-output-tokens``) is the transcriber's benchmark-only switch
(:class:`transcription.transcriber.Transcriber`): set on the instance the engine server or the embedded
stack builds, honoured only with dummy MOSS-TD weights, never part of a request.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import time
import weakref
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from engine.loaders.moss_td import TINY_DUMMY_CONFIG


def engine_config(device: str, tiny: bool, max_running: int) -> Any:
    """The engine the service runs here: what ``diarist engine`` builds from its settings
    (:meth:`diarist.settings.Settings.engine_config`: dtype, kernels, graphs and class admission resolved from
    the device), with MOSS-TD dummy weights (tiny shapes with ``tiny``) on ``device``."""
    from diarist.settings import Settings

    return Settings(engine_max_running_requests=max_running).engine_config(
        model="moss-td", load_format="dummy", dummy_config=TINY_DUMMY_CONFIG if tiny else {}, device=device,
        seed=0, kv_budget_bytes=(256 << 20) if tiny else None)


class SequenceLog:
    """Wraps ``engine.submit`` to keep every sequence the service submits: the engine's own record of each
    job (timings, tokens), to check the database's per-job metrics against."""

    def __init__(self, engine: Any) -> None:
        self.engine, self.seqs, self._submit = engine, [], engine.submit
        engine.submit = self._record

    def _record(self, seq: Any) -> Any:
        self.seqs.append(seq)
        return self._submit(seq)

    def records(self) -> list[dict]:
        """One dict per finished sequence: ``encoder_s``, ``prefill_s``, ``decode_s``, ``queue_wait_s``,
        ``wall_s`` (arrival to finish), ``prompt_tokens``, ``output_tokens``, ``audio_s``."""
        out = []
        for s in self.seqs:
            t = s.timings
            if t.finished is None:
                continue
            out.append({"encoder_s": t.encoder_s, "prefill_s": t.prefill_s, "decode_s": t.decode_s,
                        "queue_wait_s": t.queue_wait_s, "wall_s": t.finished - t.arrival,
                        "prompt_tokens": s.prompt_len, "output_tokens": len(s.output_ids),
                        "audio_s": s.mm_state.get("duration_s"), "admission_class": s.admission_class})
        return out


_WARM: weakref.WeakSet = weakref.WeakSet()


def engine_only(engine: Any, workload: dict) -> dict:
    """``bench_engine.run_workload`` (the engine benchmark's own closed loop) on ``engine``, inline stepping
    (its loop thread must not run). A shortened run (``tokens`` below ``full_tokens``) also gets
    ``projected_extra_decode_s``: the missing decode steps by ``bench_engine.project_steps_s``, as
    ``bench_engine.py`` projects them."""
    import numpy as np

    sys.path.insert(0, str(REPO / "benchmarks"))
    from bench_baselines import decoder_weight_bytes
    from bench_engine import project_steps_s, run_workload

    n, conc, tokens, full = workload["jobs"], workload["concurrency"], workload["tokens"], workload["full_tokens"]
    if engine not in _WARM:  # bench_engine.main's warm-up: kernels compiled, graphs hit, once per engine
        run_workload(engine, 4, 12.0, 8, 2, np.random.default_rng(1))
        _WARM.add(engine)
    stats, _ = run_workload(engine, n, workload["audio_s"], tokens, conc, np.random.default_rng(0))
    if full > tokens and stats["decode_step_ms_p50"] is not None:
        rounds, batch = (n, 1) if conc == 1 else (-(-n // conc), min(conc, n))
        stats["full_output_tokens"] = full
        stats["projected_extra_decode_s"] = rounds * project_steps_s(
            stats["decode_step_ms_p50"], decoder_weight_bytes(engine.model), engine.kv_bytes_per_token, batch,
            stats["prompt_tokens"], tokens, full)
    return stats


def serve_engine(args: Any) -> None:
    """``--serve-engine``: the engine server of the production-shaped topology, in its own process: the same
    pieces ``diarist engine`` runs (an :class:`engine.Engine`, ``engine_server.server.create_engine_app``,
    uvicorn on loopback) with dummy weights. Before serving it runs the engine-only workload on the same
    engine and writes it to ``--engine-only-out``; ``GET /bench/sequences`` returns the engine's record of
    every sequence the service submitted."""
    import uvicorn

    from engine import Engine
    from engine_server.server import create_engine_app

    engine = Engine(engine_config(args.device, args.tiny, args.max_running))
    workload = json.loads(args.workload)
    Path(args.engine_only_out).write_text(json.dumps(engine_only(engine, workload)))
    log = SequenceLog(engine)
    engine.start()
    app = create_engine_app(engine, engine_id=f"bench:{args.port}:{args.device}",
                            fixed_output_tokens=workload["tokens"])
    app.get("/bench/sequences")(log.records)
    try:
        uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning", lifespan="off")
    finally:
        engine.shutdown()


def _wait_http(url: str, proc: subprocess.Popen | None, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{proc.args} exited with {proc.returncode} before {url} answered")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{url} did not answer within {timeout_s:.0f} s")


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Embedded:
    """One process: :class:`cli.commands.stack.EmbeddedStack` (API, Celery on ``memory://`` with worker
    threads, SQLite, local store) around ``engine``, whose loop runs while the stack does."""

    name = "embedded"

    def __init__(self, engine: Any, data_dir: Path, tokens: int) -> None:
        from cli.commands.stack import EmbeddedStack, embedded_settings

        self.engine, self.log = engine, SequenceLog(engine)
        self.settings = embedded_settings(data_dir=data_dir, model="moss-td", served_models=["moss-td"])
        self.stack = EmbeddedStack(self.settings, engine=engine, fixed_output_tokens=tokens)
        threads = sum(self.settings.worker_threads(k) for k in ("short", "long", "webhooks"))
        self.describe = (f"embedded: one process, {threads} Celery worker threads on memory://, SQLite, local "
                         "store, engine in-process")

    def start(self) -> str:
        self.engine.start()
        self.stack.start()
        return self.stack.serve_in_thread()

    def sequences(self) -> list[dict]:
        return self.log.records()

    def stop(self) -> None:
        self.stack.stop()
        self.engine.shutdown()
        self.engine.submit = self.log._submit


def _runnable(binary: str | None) -> str | None:
    """``binary`` if it runs here (a copied redis-server may miss a shared library), else None."""
    if binary is None:
        return None
    try:
        ok = subprocess.run([binary, "--version"], check=False, capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        ok = False
    return binary if ok else None


def engine_devices(device: str, n: int) -> list[str]:
    """The device of each of ``n`` engine servers: ``cuda`` → ``cuda:0`` … ``cuda:n-1``; ``cpu`` (or one
    named device with ``n`` = 1) for all of them. Raises ValueError for a named CUDA device with ``n`` > 1."""
    if n == 1 or device == "cpu":
        return [device] * n
    if device == "cuda":
        return [f"cuda:{i}" for i in range(n)]
    raise ValueError(f"--device {device} names one GPU; --engines {n} needs --device cuda (one engine per GPU)")


def pin_to_gpu(device: str, env: dict) -> tuple[str, dict]:
    """How to start an engine server for ``device`` (an entry of :func:`engine_devices`): ``cuda:i`` becomes
    ``--device cuda:0`` with ``CUDA_VISIBLE_DEVICES`` set to the ``i``-th visible GPU (of ``env``'s
    ``CUDA_VISIBLE_DEVICES`` when set), so each process sees only its GPU, as ``diarist engine`` under
    docker-compose does; the engine's threads then need no device of their own. Other devices pass
    unchanged. Returns ``(device argument, environment)``."""
    if not device.startswith("cuda:"):
        return device, env
    i = int(device.split(":", 1)[1])
    visible = [d for d in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    return "cuda:0", {**env, "CUDA_VISIBLE_DEVICES": visible[i] if visible else str(i)}


def combine_engine_only(parts: list[dict]) -> dict:
    """The engine-only figure of ``parts`` (one :func:`engine_only` per engine server, run at the same time on
    their own GPUs): audio-s/s summed, wall the longest, the projected extra decode the largest; ``per_engine``
    keeps each. One part is returned as it is."""
    if len(parts) == 1:
        return parts[0]
    out = {"engines": len(parts), "audio_s_per_s": sum(p["audio_s_per_s"] for p in parts),
           "wall_s": max(p["wall_s"] for p in parts), "requests": sum(p["requests"] for p in parts),
           "truncated": sum(p.get("truncated", 0) for p in parts), "per_engine": parts}
    if all("projected_extra_decode_s" in p for p in parts):
        out["projected_extra_decode_s"] = max(p["projected_extra_decode_s"] for p in parts)
        out["full_output_tokens"] = parts[0]["full_output_tokens"]
    return out


def stop_processes(procs: list[subprocess.Popen]) -> None:
    """SIGTERM to ``procs`` (last started first), then wait up to 20 s for each; SIGKILL what is left."""
    for p in reversed(procs):
        p.terminate()
    for p in procs:
        try:
            p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            p.kill()


class Production:
    """API (``diarist serve``), per engine server (:func:`serve_engine`) ``--worker-processes`` ``diarist
    worker`` processes per transcription class, all separate processes on loopback: ``engines`` engine
    servers, one per GPU (:func:`engine_devices`, :func:`pin_to_gpu`), each with its worker set whose engine
    list names it first and the others after it (docs/operations.md, "Several GPUs, several hosts").
    ``workload`` is what each engine runs engine-only before serving (the per-GPU workload). Broker
    (``--broker``): Redis when asked or, with ``auto``, when ``redis-server`` is on the PATH, else kombu's
    filesystem transport (no broker server); database: one SQLite file (WAL) for all."""

    name = "production"

    def __init__(self, args: Any, data_dir: Path, workload: dict, engines: int = 1) -> None:
        self.args, self.dir, self.workload = args, data_dir, workload
        self.devices = engine_devices(args.device, engines)
        self.procs: list[subprocess.Popen] = []
        self.redis = _runnable(shutil.which("redis-server")) if args.broker in ("auto", "redis") else None
        if args.broker == "redis" and not self.redis:
            raise RuntimeError("--broker redis: no redis-server on the PATH")
        self.engine_ports, self.api_port = [free_port() for _ in self.devices], free_port()
        self.engine_urls = [f"http://127.0.0.1:{p}" for p in self.engine_ports]
        broker = f"redis://127.0.0.1:{free_port()}/0" if self.redis else "filesystem://"
        self.env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
                    "DIARIST_DATA_DIR": str(data_dir), "DIARIST_DATABASE_URL": f"sqlite:///{data_dir}/diarist.sqlite3",
                    "DIARIST_STORAGE": "local", "DIARIST_STORAGE_DIR": str(data_dir / "objects"),
                    "DIARIST_BROKER_URL": broker, "DIARIST_AUTH": "false", "DIARIST_MODEL": "moss-td",
                    "DIARIST_SERVED_MODELS": '["moss-td"]', "DIARIST_ENGINE_URL": ",".join(self.engine_urls),
                    "DIARIST_ENGINE_MAX_RUNNING_REQUESTS": str(args.max_running)}
        from diarist.settings import Settings

        st = Settings(engine_max_running_requests=args.max_running)
        self.procs_per_class = args.worker_processes
        self.threads = {k: math.ceil(st.worker_threads(k) / self.procs_per_class) for k in ("short", "long")}
        workers = (f"workers (short {self.procs_per_class} x {self.threads['short']} + long {self.procs_per_class} "
                   f"x {self.threads['long']} threads: processes x threads)")
        shape = (f"{workers} and the engine server as separate processes" if engines == 1 else
                 f"{engines} engine servers ({', '.join(self.devices)}), each with its own {workers}, all separate "
                 "processes")
        self.describe = (f"production-shaped: API ({args.api_workers} process(es)), {shape} over loopback HTTP; "
                         f"broker {broker.split(':')[0]}"
                         f"{'' if self.redis or args.broker == 'filesystem' else ' (no redis-server here)'}; SQLite shared")

    def _spawn(self, *cmd: str, log: str, env: dict | None = None) -> subprocess.Popen:
        out = open(self.dir / f"{log}.log", "wb")  # noqa: SIM115 - closed with the process
        p = subprocess.Popen(list(cmd), env=env or self.env, cwd=REPO, stdout=out, stderr=subprocess.STDOUT)
        self.procs.append(p)
        return p

    def start(self) -> str:
        py = sys.executable
        if self.redis:
            port = self.env["DIARIST_BROKER_URL"].rsplit(":", 1)[1].split("/")[0]
            self._spawn(self.redis, "--port", port, "--save", "", "--appendonly", "no", log="redis")
        subprocess.run([py, "-m", "cli", "migrate"], env=self.env, cwd=REPO, check=True,
                       capture_output=True)
        engines = []
        for i, (device, port) in enumerate(zip(self.devices, self.engine_ports, strict=True)):
            device_arg, env = pin_to_gpu(device, self.env) if len(self.devices) > 1 else (device, self.env)
            engines.append(self._spawn(
                py, str(Path(__file__).with_name("bench_service_gpu.py")), "--serve-engine", "--port", str(port),
                "--device", device_arg, *(["--tiny"] if self.args.tiny else []), "--max-running",
                str(self.args.max_running), "--workload", json.dumps(self.workload),
                "--engine-only-out", str(self.dir / self._engine_only_name(i)), log=self._name("engine", i),
                env=env))
        for url, engine in zip(self.engine_urls, engines, strict=True):
            _wait_http(f"{url}/health", engine, self.args.start_timeout)
        for e, url in enumerate(self.engine_urls):
            urls = ",".join([url, *(u for u in self.engine_urls if u != url)])  # its own engine first
            for klass in ("short", "long"):
                for i in range(self.procs_per_class):
                    self._spawn(py, "-m", "cli", "worker", "--class", klass, "--loglevel", "WARNING",
                                "--concurrency", str(self.threads[klass]), "--engine-url", urls,
                                log=self._name(f"worker-{klass}-{i}", e))
        api = self._spawn(py, "-m", "cli", "serve", "--host", "127.0.0.1", "--port", str(self.api_port),
                          "--workers", str(self.args.api_workers), log="api")
        url = f"http://127.0.0.1:{self.api_port}"
        _wait_http(f"{url}/readyz", api, 60)
        time.sleep(2.0)  # the workers' consumers: nothing answers for them, and a job waits for them anyway
        return url

    def _name(self, what: str, engine: int) -> str:
        """Log and file names: as before with one engine, ``<what>@<engine>`` with several."""
        return what if len(self.devices) == 1 else f"{what}@{engine}"

    def _engine_only_name(self, engine: int) -> str:
        return f"{self._name('engine_only', engine)}.json"

    def engine_only(self) -> dict:
        return combine_engine_only([json.loads((self.dir / self._engine_only_name(i)).read_text())
                                    for i in range(len(self.devices))])

    def sequences(self) -> list[dict]:
        return [s for url in self.engine_urls for s in httpx.get(f"{url}/bench/sequences", timeout=60).json()]

    def stop(self) -> None:
        stop_processes(self.procs)
