"""``diarist demo [--keep-running] [--file PATH]``: the walking skeleton, end to end, on this machine.

Starts the embedded stack on a free loopback port, submits the shipped two-speaker recording with
``POST /v1/jobs`` over real HTTP, polls ``GET /v1/jobs/{id}`` until it is completed, and prints the
transcript as speaker-labelled lines ``[0.52-2.31] S01: ...``.
"""

from __future__ import annotations

import argparse
import sys
import time
from importlib import resources
from pathlib import Path
from typing import Any

from cli.commands import plain
from diarist.contract.errors import CodedError

FINAL = ("completed", "failed", "canceled")


def demo_recording() -> Path:
    """The shipped demo recording (package data; see diarist/assets/NOTICE)."""
    return Path(str(resources.files("diarist") / "assets" / "demo_2spk_phonecall.wav"))


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p = subparsers.add_parser("demo", help="transcribe the shipped recording through the whole embedded stack",
                              description=plain(__doc__), formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--file", default=None, help="another recording to submit instead of the shipped one")
    p.add_argument("--keep-running", action="store_true", help="keep serving the API after the demo job")
    p.add_argument("--port", type=int, default=0, help="listen port (default: a free one)")
    p.add_argument("--data-dir", default=None, help="data folder (default DIARIST_DATA_DIR or .diarist)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for the job")
    p.add_argument("--device", default=None, help="engine device: cpu, cuda or cuda:N (default DIARIST_DEVICE, cpu)")
    p.set_defaults(func=run)
    return p


class SubmitRejected(CodedError):
    """``POST /v1/jobs`` answered an error: its ``status``, and ``code`` and ``message`` from its
    ``{"error": ...}`` body."""

    def __init__(self, status: int, code: str, message: str):
        super().__init__(code, message)
        self.status = status

    def __str__(self) -> str:
        return f"POST /v1/jobs answered {self.status}: {self.code}: {self.message}"


def submit_and_wait(base_url: str, path: Path, timeout_s: float, headers: dict | None = None,
                    log=print) -> dict:
    """POST the file to ``/v1/jobs``, poll until final; returns the final job JSON. Raises on HTTP errors."""
    import httpx

    with httpx.Client(base_url=base_url, timeout=60, headers=headers or {}) as c, open(path, "rb") as f:
        r = c.post("/v1/jobs", files={"file": (path.name, f)})
        if r.status_code >= 400:
            try:
                err = r.json()["error"]
                code, message = str(err["code"]), str(err["message"])
            except (ValueError, KeyError, TypeError):
                code, message = "http_error", r.text
            raise SubmitRejected(r.status_code, code, message)
        job = r.json()
        log(f"submitted {path.name} ({job['duration']:.1f} s of audio) as job {job['id']} → {job['queue']}")
        deadline = time.monotonic() + timeout_s
        last = None
        while job["status"] not in FINAL:
            if time.monotonic() > deadline:
                raise TimeoutError(f"job {job['id']} still {job['status']} after {timeout_s:g} s")
            time.sleep(0.25)
            job = c.get(f"/v1/jobs/{job['id']}").raise_for_status().json()
            if job["status"] != last:
                last = job["status"]
                log(f"  status: {last}")
        return job


def run(args: argparse.Namespace) -> int:
    import httpx

    from cli.commands.stack import EmbeddedStack, embedded_settings
    from cli.listen import check_listen

    path = Path(args.file) if args.file else demo_recording()
    if not path.is_file():
        print(f"diarist: error: not_found: no such file: {path}", file=sys.stderr)
        return 2
    check_listen("127.0.0.1", args.port)  # a --port in use: one line and exit 2 before the stack starts
    overrides = {k: v for k, v in (("data_dir", args.data_dir), ("device", args.device)) if v}
    t0 = time.monotonic()
    print("starting the embedded stack (SQLite, local object store, in-memory Celery, in-process engine)...",
          flush=True)
    stack = EmbeddedStack(embedded_settings(**overrides)).start()
    try:
        url = stack.serve_in_thread("127.0.0.1", args.port)
        print(f"API listening on {url}  (docs: {url}/docs), ready in {time.monotonic() - t0:.1f} s", flush=True)
        try:
            job = submit_and_wait(url, path, args.timeout, log=lambda m: print(m, flush=True))
        except SubmitRejected as e:  # bad media (decode_failed, too_short, ...): one line, like `transcribe`
            print(f"diarist: error: {e.code}: {e.message}", file=sys.stderr)
            return 2
        except TimeoutError as e:
            print(f"diarist: error: timeout: {e}", file=sys.stderr)
            return 1
        if job["status"] != "completed":
            err = job.get("error") or {}
            print(f"diarist: error: {err.get('code')}: {err.get('message')}", file=sys.stderr)
            return 1
        m = job.get("metrics") or {}
        print(f"completed: {job['num_speakers']} speakers, processing {m.get('processing_s') or 0:.1f} s, "
              f"RTF {m.get('rtf') or 0:.2f}\n", flush=True)
        txt = httpx.get(f"{url}/v1/jobs/{job['id']}/transcript", params={"format": "txt"}, timeout=60)
        sys.stdout.write(txt.raise_for_status().text)
        sys.stdout.flush()
        if args.keep_running:
            print(f"\nstill serving on {url}; Ctrl-C to stop", flush=True)
            while True:
                time.sleep(3600)
        return 0
    finally:
        stack.stop()
