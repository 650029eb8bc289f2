"""Two engine servers and two worker sets on loopback against one Postgres, Redis and S3 (issue 22 item 4):
the production scale-out pattern of docs/operations.md ("Several GPUs, several hosts") on a CPU machine.

Engines ``a`` and ``b`` are ``tests.faults.tiny_engine`` servers (tiny dummy MOSS-TD, every transcript the
same number of tokens). Each engine has its worker set, a ``diarist worker --class short`` and a ``--class
long``, whose ``DIARIST_ENGINE_URL`` names its own engine first and the other one after it, and which serves
its Prometheus counters on its own port. One ``diarist serve`` takes the jobs. Settings are the fault suite's
scaled-down ones (:data:`tests.faults.topology.FAST`), with a 3 s class threshold so that short test clips
land in both duration classes.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import httpx

from tests.faults.topology import LoopbackStack, Proc
from tests.servers import free_port, wait_port

ENGINES = ("a", "b")
CLASSES = ("short", "long")
LONG_THRESHOLD_S = 3.0


class ScaleOut(LoopbackStack):
    """The topology of the module doc; ``start()`` brings it up, ``kill_engine(name)`` SIGKILLs one engine."""

    bucket = "scaleout"
    tail_chars = 1500

    def __init__(self, workdir: Path, short_threads: int = 3, long_threads: int = 2, output_tokens: int = 24,
                 rows: int = 8) -> None:
        super().__init__(workdir)
        self.threads = {"short": short_threads, "long": long_threads}
        self.output_tokens, self.rows = output_tokens, rows
        self.eports = {e: free_port() for e in ENGINES}
        self.mports = {(e, k): free_port() for e in ENGINES for k in CLASSES}

    def engine_url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.eports[name]}"

    def engine_id(self, name: str) -> str:
        return f"tiny:{self.eports[name]}"  # what tests.faults.tiny_engine names itself

    def start(self) -> ScaleOut:
        self.aport = free_port()
        env = self.service_env()
        env.update({"DIARIST_MODEL": "moss-td", "DIARIST_SERVED_MODELS": '["moss-td"]',
                    "DIARIST_LONG_THRESHOLD_S": str(LONG_THRESHOLD_S),
                    "DIARIST_ENGINE_MAX_RUNNING_REQUESTS": str(self.rows),
                    "DIARIST_ENGINE_KV_BUDGET_BYTES": str(32 << 20)})
        token = self.api_token()
        for e in ENGINES:
            self.procs[f"engine-{e}"] = Proc(f"engine-{e}", ["--port", str(self.eports[e]), "--output-tokens",
                                                             str(self.output_tokens)], env, self.logs,
                                             module="tests.faults.tiny_engine").start()
        for e in ENGINES:
            urls = ",".join([self.engine_url(e), *(self.engine_url(o) for o in ENGINES if o != e)])
            for k in CLASSES:
                self.procs[f"{k}-{e}"] = Proc(f"{k}-{e}", [
                    "worker", "--class", k, "--concurrency", str(self.threads[k]), "--engine-url", urls,
                    "--metrics-port", str(self.mports[(e, k)])], env, self.logs).start()
        self.procs["api"] = Proc("api", ["serve", "--port", str(self.aport)], env, self.logs).start()
        for port in (self.aport, *self.eports.values(), *self.mports.values()):
            wait_port(port, 300)
        self.connect(self.aport, token)
        return self

    def engine_stats(self, name: str) -> dict | None:
        try:
            return httpx.get(f"{self.engine_url(name)}/stats", timeout=5).json()
        except httpx.HTTPError:
            return None

    def kill_engine(self, name: str) -> None:
        self.procs[f"engine-{name}"].kill(signal.SIGKILL)

    def completions(self, engine: str) -> int:
        """Jobs completed by ``engine``'s worker set (its workers' ``diarist_jobs_finished_total``)."""
        from prometheus_client.parser import text_string_to_metric_families

        n = 0.0
        for k in CLASSES:
            text = httpx.get(f"http://127.0.0.1:{self.mports[(engine, k)]}/metrics", timeout=5).text
            for fam in text_string_to_metric_families(text):
                if fam.name == "diarist_jobs_finished":
                    n += sum(s.value for s in fam.samples
                             if s.name.endswith("_total") and s.labels.get("status") == "completed")
        return int(n)


def wait_until(cond, timeout_s: float, poll_s: float = 0.05) -> bool:
    """Poll ``cond()`` until true (returns True) or ``timeout_s`` passed (returns False)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(poll_s)
    return False
