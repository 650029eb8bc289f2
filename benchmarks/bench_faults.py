"""Issue 17's fault table, re-measured: each fault injected with N jobs in flight on the real topology.

Production (Postgres, Redis, moto's S3 server, ``diarist engine`` on CPU with the bundled tiny.en, one
short worker and one webhooks worker process, the API) for: Postgres stopped 15 s, the S3 endpoint down
20 s, the engine server SIGKILLed and back in 10 s, Redis restarted (~9 s, empty; 3 submits during the
outage), the short worker SIGKILLed; and ``serve --embedded`` restarted after SIGKILL and after SIGTERM.
The harness is ``tests/faults/harness.py`` (the topologies and their scaled-down lease/sweep settings:
``tests/faults/topology.py``), the one the CI suite ``tests/faults/test_faults.py`` asserts with.

Per fault (JSON, also written to ``--out``): job statuses and error codes, jobs stuck at the recovery
bound, seconds from the fault's end until every job was final, transcript objects per job, distinct
webhook messages per job and POSTs received, attempts, and for Redis the answers to submits during the
outage and the rows they left. Plus the command, commit and machine.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_faults.py --jobs 20 --out benchmarks/results/faults_cpu.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

PRODUCTION = ("postgres_stopped_15s", "s3_down_20s", "engine_sigkill_back_in_10s", "redis_restarted_9s",
              "short_worker_sigkill")


def main() -> int:
    from tests.faults.harness import run_embedded_restart, run_fault
    from tests.faults.topology import Cluster, make_clip, new_workdir

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=20, help="jobs in flight per fault")
    ap.add_argument("--audio", default=str(REPO.parent / "shared" / "data" / "en_jfk_inaugural" / "jfk.flac"),
                    help="recording whose first 3 s every job transcribes")
    ap.add_argument("--bound", type=float, default=180.0, help="recovery bound per fault (seconds)")
    ap.add_argument("--out", default=None, help="write the JSON report here too")
    args = ap.parse_args()

    work = new_workdir()
    clip = make_clip(Path(args.audio), work / "clip.wav")
    results, t0 = [], time.monotonic()
    cluster = Cluster(work / "production").start()
    try:
        for fault in PRODUCTION:
            r = run_fault(cluster, fault, clip, n=args.jobs, bound_s=args.bound)
            results.append(r.as_dict())
            print(json.dumps(r.as_dict()), file=sys.stderr, flush=True)
    finally:
        cluster.stop()
    for sig in (signal.SIGKILL, signal.SIGTERM):
        r = run_embedded_restart(work / f"embedded-{sig.name}", clip, sig, n=args.jobs, bound_s=args.bound)
        results.append(r.as_dict())
        print(json.dumps(r.as_dict()), file=sys.stderr, flush=True)

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True,
                            check=False).stdout.strip()
    ok = all(r["statuses"] == {"completed": r["jobs"]} and r["stuck"] == 0
             and r["transcripts_per_job"] == {"1": r["jobs"]} and r["webhook_messages_per_job"] == {"1": r["jobs"]}
             for r in results)
    report = {"benchmark": "faults", "command": shlex.join(["python", *sys.argv]), "commit": commit,
              "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                          "load_avg_1m_at_end": os.getloadavg()[0]},
              "settings": "tests/faults/topology.py FAST (lease 4 s, sweep 1 s, queued re-drive 20 s, "
                          "visibility timeout 3600 s)",
              "all_completed_once": ok, "wall_s": round(time.monotonic() - t0, 1), "faults": results}
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
