"""Peak memory of the Whisper cascade on a long recording (issue 21, item 11: the 6 h bound).

Builds a ``--hours`` long 16 kHz mono WAV by tiling real recordings of the shared data folder (seven clips,
meetings, a phone call, read speech, levelled to -6 dBFS peaks, 145.6 s per cycle), then transcribes it
with the whole cascade (VAD, Whisper windows, word alignment, speakers) in a child process, as
``diarist transcribe`` does. The parent samples the child's resident memory every ``--sample-s`` seconds
and reads its peak (``getrusage`` ``ru_maxrss``) when it exits. Prints JSON; ``--out`` also writes it.

    nice -n 10 python benchmarks/bench_long_recording.py --hours 4 --out benchmarks/results/long_recording_cpu.json
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import resource
import subprocess
import sys
import threading
import time
import wave
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CLIPS = ["en_2spk_phonecall_pyannote_sample/sample.wav", "en_ami_meeting_dev00_2spk/dev00.wav",
         "en_ami_meeting_trn07_4spk/trn07.wav", "en_librispeech_1995-1837-0001/librispeech-1995-1837-0001.wav",
         "en_jfk_inaugural/jfk.flac", "en_ami_meeting_trn05_4spk/trn05.wav",
         "en_librispeech_1272-128104-0000_picovoice/test.wav"]


def tile(data: Path, hours: float, out: Path) -> float:
    """Write the tiled WAV (int16, 16 kHz mono); returns its duration in seconds."""
    import numpy as np

    from transcription.audio import decode_audio

    parts = []
    for c in CLIPS:
        x = decode_audio(data / c).samples[0]
        parts.append((x / max(1e-3, float(np.abs(x).max())) * 0.5 * 32767).astype("<i2"))
    cycle = np.concatenate(parts)
    n = int(hours * 3600 * 16_000)
    with wave.open(str(out), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16_000)
        done = 0
        while done < n:
            part = cycle[: n - done]
            w.writeframes(part.tobytes())
            done += part.size
    return n / 16_000


def child(path: str, device: str, diarize: bool) -> None:
    """Load the engine, report the RSS, transcribe ``path``, print the result summary as the last line."""
    from diarist.settings import Settings
    from diarist.transcript import Transcript
    from engine import Engine
    from transcription.transcriber import TranscribeOptions, Transcriber

    tr = Transcriber(Engine(Settings().engine_config(device=device)))
    print(json.dumps({"loaded_rss_bytes": _rss(os.getpid())}), flush=True)
    t0 = time.perf_counter()
    r = tr.transcribe(path, TranscribeOptions(diarize=diarize))
    wall = time.perf_counter() - t0
    t = Transcript.from_engine(r)
    print(json.dumps({"wall_s": wall, "metrics": r.to_json()["metrics"], "segments": len(t.segments),
                      "words": len(t.text.split()), "speakers": len(t.speakers), "finish_reason": t.finish_reason,
                      "coverage": t.coverage, "incomplete": t.incomplete, "incomplete_reason": t.incomplete_reason}),
          flush=True)


def _rss(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hours", type=float, default=4.0)
    p.add_argument("--data", default=os.environ.get("DIARIST_TEST_DATA", str(REPO.parent / "shared" / "data")))
    p.add_argument("--workdir", default="/tmp")
    p.add_argument("--device", default="cpu")
    p.add_argument("--no-diarize", dest="diarize", action="store_false")
    p.add_argument("--sample-s", type=float, default=10.0)
    p.add_argument("--out", default=None)
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        child(args.child, args.device, args.diarize)
        return
    wav = Path(args.workdir) / f"diarist_tiled_{args.hours:g}h.wav"
    audio_s = tile(Path(args.data), args.hours, wav)
    cmd = [sys.executable, __file__, "--child", str(wav), "--device", args.device]
    if not args.diarize:
        cmd.append("--no-diarize")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env)
    timeline: list[list[float]] = []

    def sample() -> None:
        while proc.poll() is None:
            rss = _rss(proc.pid)
            if rss is not None:
                timeline.append([round(time.monotonic() - t0, 1), rss])
            time.sleep(args.sample_s)

    threading.Thread(target=sample, daemon=True).start()
    lines = proc.stdout.read().splitlines()
    proc.wait()
    wav.unlink(missing_ok=True)
    if proc.returncode != 0:
        sys.exit(f"the transcription failed with exit status {proc.returncode}")
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024  # Linux: KiB
    loaded, summary = json.loads(lines[0]), json.loads(lines[-1])
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=REPO,
                            check=False).stdout.strip()
    report = {"command": " ".join(["python", "benchmarks/bench_long_recording.py", *sys.argv[1:]]),
              "git_commit": commit or None, "created_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
              "host": {"cpus": os.cpu_count(), "device": args.device}, "audio_s": audio_s, "clips": CLIPS,
              "diarize": args.diarize, "peak_rss_bytes": peak, "peak_rss_gib": round(peak / 2**30, 2),
              "loaded_rss_bytes": loaded["loaded_rss_bytes"],
              "recording_rss_gib": round((peak - loaded["loaded_rss_bytes"]) / 2**30, 2),
              "gib_per_audio_hour": round((peak - loaded["loaded_rss_bytes"]) / 2**30 / (audio_s / 3600), 3),
              **summary, "rss_timeline_s_bytes": timeline}
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
