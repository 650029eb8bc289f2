"""Words kept by the Whisper path on the AMI excerpts, the non-speech items and speech through a window cut.

For each item: the words Diarist's transcriber outputs (tiny.en, CPU, no diarization: speakers do not change
the words), the reference's word count and WER where the shared data has a transcript, and, as a peer
where it has none (the AMI meeting excerpts have only RTTMs), the words faster-whisper outputs with the same
tiny.en weights and its default temperature fallback. Seam items are shared clips played back to back and
decoded as one speech run (no pause for the VAD to cut at), so the 30 s cut falls inside speech.
``forced_greedy_loop:`` items are the AMI excerpts again with every greedy attempt forced into the
" yeah, yeah, ..." loop the issue reports (sampled attempts run free), since at this commit's VAD the
excerpts no longer loop by themselves.

Run from a checkout (``--tree`` points at the one to measure, e.g. an older commit's worktree)::

    python benchmarks/eval_decode_recovery.py --tree . --out benchmarks/results/eval_decode_recovery_cpu.json

Prints and writes JSON: the command, the tree's commit, and per item ``words``, ``ref_words``, ``wer``,
``peer_words``, ``finish_reason``, ``incomplete``, ``windows`` (the transcriber's window account, when it
gives one).
"""

from __future__ import annotations

import argparse
import io
import json
import re
import subprocess
import sys
import time
from pathlib import Path

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
AMI = ["en_ami_meeting_dev00_2spk/dev00.wav", "en_ami_meeting_trn05_4spk/trn05.wav",
       "en_ami_meeting_trn07_4spk/trn07.wav", "en_ami_headset_ES2011a_40-46s/ES2011a.Headset-0-40s-46s.wav"]
NON_SPEECH = [
    "music_brahms_hungarian_dance5_ogg/Hungarian_Dance_number_5_-_Allegro_in_F_sharp_minor_(string_orchestra).ogg",
    "nonspeech_humpback_whale_ogg/glacier-bay-humpback.ogg",
    "nonspeech_mp4_aac_5.1_bigbuckbunny/big_buck_bunny_small.mp4",
    "noise_stationary_picovoice_empty/empty.wav",
    "silence_and_noise_1s_tflite/noise_1000ms.wav",
    "silence_and_noise_1s_tflite/silence_1000ms.wav",
]
CLIPS = {"lib": "en_librispeech_1995-1837-0001/librispeech-1995-1837-0001.wav",
         "tst": "en_librispeech_1272-128104-0000_picovoice/test.wav", "jfk": "en_jfk_inaugural/jfk.flac"}
SEAMS = [["lib", "tst", "lib", "tst", "jfk"], ["tst", "jfk", "lib", "tst", "lib"], ["jfk", "jfk", "jfk", "jfk"]]


def norm(text: str) -> str:
    """Lowercase, punctuation removed, whitespace collapsed (the tests' WER normalisation)."""
    return " ".join(re.sub(r"[^a-z0-9' ]+", " ", text.lower()).split())


def reference(path: Path) -> str | None:
    txt = path.with_suffix(".txt")
    return txt.read_text() if txt.is_file() else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tree", default=".", help="checkout whose transcriber is measured")
    ap.add_argument("--out", help="write the JSON here too")
    ap.add_argument("--no-peer", action="store_true", help="skip faster-whisper")
    args = ap.parse_args()
    tree = Path(args.tree).resolve()
    sys.path.insert(0, str(tree))
    import jiwer
    import numpy as np
    import soundfile

    from engine import Engine, EngineConfig
    from engine.loaders.registry import bundled_whisper_dir
    from transcription.audio import decode_audio
    from transcription.transcriber import TranscribeOptions, Transcriber

    model_dir = str(bundled_whisper_dir())
    tr = Transcriber(Engine(EngineConfig(model="whisper", model_path=model_dir, kv_budget_bytes=512 << 20,
                                         max_running_requests=24)))
    peer = None
    if not args.no_peer:
        from faster_whisper import WhisperModel

        peer = WhisperModel(model_dir, device="cpu", compute_type="float32", cpu_threads=2)
    whisper = tr.pipeline  # the Whisper family's pipeline (transcription.whisper.pipeline): VAD and rules
    speech_fn = whisper._speech

    def run(name: str, source, ref: str | None, peer_source=None, one_run_s: float | None = None) -> dict:
        if one_run_s is not None:  # the whole clip is one speech run: the result of a VAD with no pause to cut
            whisper._speech = lambda w, should_cancel=None: ([(0.0, one_run_s)], None)
        t0 = time.perf_counter()
        r = tr.transcribe(source, TranscribeOptions(diarize=False))
        whisper._speech = speech_fn
        hyp = norm(" ".join(s.text for s in r.segments))
        item = {"item": name, "words": len(hyp.split()), "seconds": round(time.perf_counter() - t0, 2),
                "finish_reason": r.finish_reason, "incomplete": r.incomplete,
                "incomplete_reason": r.incomplete_reason, "windows": r.windows, "text": hyp}
        if ref is not None:
            out = jiwer.process_words(norm(ref), hyp) if norm(ref) else None
            item.update(ref_words=len(norm(ref).split()),
                        wer=None if out is None else round(out.wer, 4),
                        deletions=None if out is None else out.deletions,
                        insertions=None if out is None else out.insertions)
        if peer is not None and peer_source is not None:
            segs, _ = peer.transcribe(peer_source)
            item["peer_words"] = len(norm(" ".join(s.text for s in segs)).split())
        print(json.dumps({k: v for k, v in item.items() if k not in ("text", "windows")}), flush=True)
        return item

    items = []
    for rel in AMI + NON_SPEECH:
        p = DATA / rel
        items.append(run(rel, p, reference(p), str(p)))

    def trimmed(key: str) -> np.ndarray:
        w = decode_audio(DATA / CLIPS[key]).mono
        loud = np.flatnonzero(np.abs(w) > 0.01)
        return w[loud[0] : loud[-1] + 1]

    # The loop the issue saw on an AMI excerpt (greedy tiny.en saying "yeah, yeah, ..."), forced: after six
    # tokens every greedy attempt of every window is made to repeat " yeah,"; sampled attempts run free.
    import torch

    rules = whisper.rules

    def force_greedy_loop(seq, logits):
        x = rules(seq, logits)
        sampling = getattr(seq, "sampling", None)  # older trees: every sequence is greedy
        if len(seq.output_ids) >= 6 and (sampling is None or sampling.temperature == 0.0):
            x = torch.full_like(x, -float("inf"))
            x[(10194, 11)[len(seq.output_ids) % 2]] = 0.0  # " yeah", ","
        return x

    whisper.rules = force_greedy_loop
    for rel in AMI:
        p = DATA / rel
        items.append(run("forced_greedy_loop:" + rel, p, reference(p)))
    whisper.rules = rules

    for order in SEAMS:
        wave = np.concatenate([trimmed(k) for k in order]).astype(np.float32)
        buf = io.BytesIO()
        soundfile.write(buf, wave, 16000, format="WAV")
        ref = " ".join(reference(DATA / CLIPS[k]) for k in order)
        items.append(run("seam:" + "+".join(order), buf.getvalue(), ref, None, len(wave) / 16000))
    commit = subprocess.run(["git", "-C", str(tree), "rev-parse", "HEAD"], capture_output=True, text=True,
                            check=False).stdout
    report = {"command": " ".join(["python", *sys.argv]), "commit": commit.strip(), "tree": str(tree),
              "model": "tiny.en (CTranslate2 fp16 weights, float32 on the CPU)", "items": items}
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
