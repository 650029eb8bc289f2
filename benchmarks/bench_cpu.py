"""CPU throughput of the embedded default (tiny.en) against faster-whisper on the same CTranslate2 files.

Both sides transcribe the English clips of the shared data folder greedily (beam 1) with silero VAD and
no speaker cascade (faster-whisper has none), float32 on the CPU, one clip at a time, after one warm-up
clip. RTF = processing seconds / audio seconds. Prints JSON; ``--out`` also writes it.

    python benchmarks/bench_cpu.py --out benchmarks/results/cpu.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import time
from pathlib import Path

ENGLISH = [
    "en_jfk_inaugural/jfk.flac",
    "en_2spk_phonecall_pyannote_sample/sample.wav",
    "en_librispeech_1995-1837-0001/librispeech-1995-1837-0001.wav",
    "en_librispeech_1272-128104-0000_picovoice/test.wav",
    "en_ami_headset_ES2011a_40-46s/ES2011a.Headset-0-40s-46s.wav",
    "en_timit_LDC93S1_16k_8k_44k-stereo/LDC93S1.wav",
    "en_ljspeech_LJ002-0020_22k/LJ002-0020.wav",
    "en_stereo_2spk_overlap_fasterwhisper/stereo_diarization.wav",
    "multi_en_de_codeswitch_mp3_fasterwhisper/multilingual.mp3",
]


def _ours(files: list[Path], threads: int, repeats: int) -> dict:
    from engine import Engine, EngineConfig
    from transcription.audio import decode_audio
    from transcription.transcriber import TranscribeOptions, Transcriber

    tr = Transcriber(Engine(EngineConfig(threads=threads or None)))
    opts = TranscribeOptions(diarize=False)
    tr.transcribe(files[0], opts)  # warm-up
    per, total_audio, total_s = [], 0.0, 0.0
    for f in files:
        dur = decode_audio(f).duration
        best = min(_timed(lambda f=f: tr.transcribe(f, opts)) for _ in range(repeats))
        per.append({"file": f.name, "audio_s": dur, "seconds": best, "rtf": best / dur})
        total_audio += dur
        total_s += best
    return {"items": per, "audio_s": total_audio, "seconds": total_s, "rtf": total_s / total_audio}


def _faster_whisper(files: list[Path], threads: int, repeats: int, compute_type: str) -> dict:
    from faster_whisper import WhisperModel

    from engine.loaders import bundled_whisper_dir
    from transcription.audio import decode_audio

    model = WhisperModel(str(bundled_whisper_dir()), device="cpu", compute_type=compute_type, cpu_threads=threads)

    def run(f: Path) -> None:
        segments, _ = model.transcribe(str(f), beam_size=1, vad_filter=True, condition_on_previous_text=False,
                                       temperature=0.0, language="en")
        list(segments)

    run(files[0])
    per, total_audio, total_s = [], 0.0, 0.0
    for f in files:
        dur = decode_audio(f).duration
        best = min(_timed(lambda f=f: run(f)) for _ in range(repeats))
        per.append({"file": f.name, "audio_s": dur, "seconds": best, "rtf": best / dur})
        total_audio += dur
        total_s += best
    return {"items": per, "audio_s": total_audio, "seconds": total_s, "rtf": total_s / total_audio,
            "compute_type": compute_type}


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", default=str(Path(__file__).resolve().parents[2] / "shared" / "data"))
    p.add_argument("--threads", type=int, default=0, help="engine threads (0: the engine's default)")
    p.add_argument("--fw-threads", type=int, default=1, help="faster-whisper cpu_threads (default: as many as the engine)")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--out")
    a = p.parse_args()
    files = [Path(a.data) / f for f in ENGLISH if (Path(a.data) / f).is_file()]
    import torch

    ours = _ours(files, a.threads, a.repeats)
    ours["torch_threads"] = torch.get_num_threads()
    fw = _faster_whisper(files, a.fw_threads, a.repeats, "float32")
    fw8 = _faster_whisper(files, a.fw_threads, a.repeats, "int8")
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], check=False, capture_output=True,
                            text=True).stdout.strip()
    out = {
        "benchmark": "cpu_tiny_en_vs_faster_whisper",
        "command": "python benchmarks/bench_cpu.py " + " ".join(f"--{k.replace('_', '-')} {v}" for k, v in vars(a).items() if v and k != "out"),
        "commit": commit,
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "torch": torch.__version__,
                    "load_avg_1m_at_end": os.getloadavg()[0]},
        "files": [f.name for f in files],
        "diarist": ours,
        "faster_whisper_float32": fw,
        "faster_whisper_int8": fw8,
        "ratio_vs_faster_whisper_float32": ours["seconds"] / fw["seconds"],
        "ratio_vs_faster_whisper_int8": ours["seconds"] / fw8["seconds"],
        "target": "ratio_vs_faster_whisper_float32 <= 2.0",
    }
    text = json.dumps(out, indent=2)
    print(text)
    if a.out:
        Path(a.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
