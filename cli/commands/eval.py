"""`diarist eval DATA_DIR [--model ...] [--out report.json]`: score transcripts against references.

Wire-up for the main CLI: ``add_parser(subparsers)`` registers the subcommand (its
``func`` default is :func:`run`); ``main(argv)`` runs it standalone. The metric logic
is in :mod:`evaluation.harness` and :mod:`evaluation.scoring`.

While it runs, a line per item goes to stderr; when stderr is a terminal, a progress line under them shows the
items done of the total, elapsed time, an estimate of what is left and the running figures (pooled WER,
cpWER, DER, RTF so far). ``--quiet`` prints neither. The table on stdout is the same either way.

Exit status: 0 when the run completed (per-item failures are in the report), 2 for
a usage problem (missing data folder, no transcription pipeline, nothing to score).
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.util
import json
import shlex
import subprocess
import sys
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from cli.commands import plain
from diarist.contract.result import TranscriptionResult
from evaluation.harness import TranscribeFn, aggregate, evaluate

DEFAULT_COLLARS = (0.0, 0.25)


def _seconds(text: str) -> float:
    """argparse type: a collar in seconds, finite and >= 0."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not 0 <= v < float("inf"):
        raise argparse.ArgumentTypeError(f"a collar is >= 0 s, got {text}")
    return v


def _add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("data_dir", help="folder of items, one folder each, references beside the audio (see evaluation.references)")
    p.add_argument("--model", default="whisper", help="model family: whisper (embedded tiny.en) or moss-td")
    p.add_argument("--model-path", default=None, help="checkpoint directory, or a packaged Whisper: tiny.en (default) "
                   "or base (multilingual)")
    p.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default DIARIST_DEVICE, cpu)")
    p.add_argument("--no-diarize", dest="diarize", action="store_false",
                   help="skip the speaker cascade (ASR-only scores; every segment gets one speaker)")
    p.add_argument("--out", default=None, help="write the JSON report to this file")
    p.add_argument("--items", action="append", default=None, metavar="GLOB",
                   help="only items whose id (folder/file) matches; repeatable")
    p.add_argument("--collar", action="append", type=_seconds, default=None, metavar="SECONDS",
                   help="DER/JER collar on each side of reference boundaries; repeatable (default 0 and 0.25)")
    p.add_argument("--hyp-dir", default=None,
                   help="score saved engine results (<id with / as __>.json) instead of transcribing")
    p.add_argument("--save-hyp", default=None, help="save each raw engine result in this folder")
    p.add_argument("--quiet", "-q", action="store_true", help="no per-item lines or progress on stderr")


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``eval`` on an ``argparse`` subparsers object; returns the new parser."""
    p = subparsers.add_parser("eval", help="transcribe a data folder and report WER/CER/cpWER/DER/JER/RTF",
                              description=plain(__doc__).splitlines()[0])
    _add_arguments(p)
    p.set_defaults(func=run)
    return p


def engine_transcribe_fn(model: str, model_path: str | None, device: str, diarize: bool = True) -> TranscribeFn:
    """Build ``transcribe_fn(path, multichannel=False) -> TranscriptionResult`` on an in-process engine.

    Imports torch and the engine (only here: the rest of ``diarist eval`` does not need them).
    """
    from diarist.settings import Settings
    from engine import Engine
    from transcription.transcriber import TranscribeOptions, Transcriber

    transcriber = Transcriber(Engine(Settings().engine_config(model=model, model_path=model_path, device=device)))

    def transcribe(path: Path, multichannel: bool = False) -> TranscriptionResult:
        return transcriber.transcribe(str(path), TranscribeOptions(multichannel=multichannel, diarize=diarize))

    return transcribe


def replay_transcribe_fn(hyp_dir: str | Path, data_dir: str | Path) -> TranscribeFn:
    """``transcribe_fn`` returning results saved by ``--save-hyp`` (read with
    :meth:`TranscriptionResult.from_json`: a malformed file is that item's error); item ids are relative to
    ``data_dir``."""
    hyp_dir, data_dir = Path(hyp_dir), Path(data_dir)

    def replay(path: Path, **_hints: Any) -> TranscriptionResult:
        name = Path(path).relative_to(data_dir).as_posix()
        f = hyp_dir / (name.replace("/", "__") + ".json")
        if not f.is_file():
            raise FileNotFoundError(f"no saved result for {name} in {hyp_dir} (expected {f.name})")
        return TranscriptionResult.from_json(json.loads(f.read_text(encoding="utf-8")))

    return replay


def _git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], check=False, capture_output=True, text=True, timeout=5,
                             cwd=Path(__file__).resolve().parent)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def _fmt(value: Any, pct: bool = True) -> str:
    if value is None:
        return "-"
    return f"{100 * value:.1f}" if pct else f"{value:.3f}"


def running_figures(overall: dict, collars: tuple[float, ...]) -> str:
    """The progress line's figures from :func:`evaluation.harness.aggregate` of the items done so far: pooled
    WER, cpWER, DER at the widest collar, RTF (``-`` for one not scored yet)."""
    c = max(collars)

    def pct(v: Any) -> str:
        return "-" if v is None else f"{100 * v:.1f}%"

    return (f"WER {pct(overall['wer'])} cpWER {pct(overall['cpwer'])} DER(c{c:g}) {pct(overall[f'der_c{c:g}'])} "
            f"RTF {_fmt(overall['rtf'], False)}")


def format_table(report: dict) -> str:
    """A fixed-width summary: one line per item (rates in %), every audio file not scored with the reason,
    then the totals (pooled, and the mean over items in parentheses)."""
    cols = report["collars_s_each_side"]
    head = f"{'item':48} {'dur_s':>6} {'rtf':>6} {'wer':>6} {'cer':>6} {'cpwer':>6} " + " ".join(
        f"{'der' + format(c, 'g'):>7}" for c in cols) + f" {'spk':>5}  note"
    lines = [head]
    for r in report["items"]:
        note = r.get("error") or "; ".join(r.get("reference_errors", []))
        if r.get("expected_no_speech") and "error" not in r:
            note = note or f"no speech expected: {r['hyp_words']} words, {r['hyp_speakers']} speakers"
        spk = "-" if r.get("ref_speakers") is None else f"{r['ref_speakers']}/{r.get('hyp_speakers')}"
        lines.append(f"{r['id'][:48]:48} {_fmt(r.get('duration'), False)[:6]:>6} {_fmt(r.get('rtf'), False):>6} "
                     f"{_fmt(r.get('wer')):>6} {_fmt(r.get('cer')):>6} {_fmt(r.get('cpwer')):>6} "
                     + " ".join(f"{_fmt(r.get(f'der_c{c:g}')):>7}" for c in cols) + f" {spk:>5}  {note}")
    for n in report.get("not_scored", []):
        lines.append(f"{n['id'][:48]:48} not scored: {n['reason']}")
    o = report["overall"]

    def pct(v: Any) -> str:
        return "-" if v is None else f"{100 * v:.1f}%"

    def both(key: str) -> str:
        return f"{pct(o[key])} (mean {pct(o.get(key + '_mean'))})"

    lines.append(f"overall: {o['items']} items, {o['failed']} failed, {len(report.get('not_scored', []))} not "
                 f"scored; pooled (item mean): WER {both('wer')}, CER {both('cer')}, cpWER {both('cpwer')}, "
                 f"cpCER {both('cpcer')}, "
                 + ", ".join(f"DER(c{c:g}) {both(f'der_c{c:g}')}, JER(c{c:g}) {both(f'jer_c{c:g}')}"
                             for c in cols)
                 + f"; speaker count within ±1: {o['speaker_count_within_1']}/{o['speaker_count_items']}; "
                   f"RTF {_fmt(o['rtf'], False)}")
    if o.get("speaker_count_items"):
        lines.append(speaker_line(o, cols))
    for lang, g in (report.get("by_language") or {}).items():
        lines.append(f"  {lang}: {g['items']} items; WER {pct(g['wer'])}, CER {pct(g['cer'])}, "
                     f"RTF {_fmt(g['rtf'], False)}")
    return "\n".join(lines)


def speaker_line(o: dict, cols: list[float]) -> str:
    """The speaker figures of the totals ``o`` in one line: per collar the pooled DER split (missed speech,
    missed overlap, false alarm, confusion) and the share of the reference's overlapped time the hypothesis
    gives two speakers; then the speaker count (exact items, signed mean error)."""
    def pct(v: Any) -> str:
        return "-" if v is None else f"{100 * v:.1f}%"

    parts = []
    for c in cols:
        k = f"c{c:g}"
        if o.get(f"der_{k}") is None:
            continue
        parts.append(f"DER({k}) {pct(o[f'der_{k}'])} = missed speech {pct(o.get(f'der_{k}_missed_speech'))} + "
                     f"missed overlap {pct(o.get(f'der_{k}_missed_overlap'))} + false alarm "
                     f"{pct(o.get(f'der_{k}_false_alarm'))} + confusion {pct(o.get(f'der_{k}_confusion'))}, "
                     f"overlap given 2 speakers {pct(o.get(f'overlap_{k}_two_speakers'))} "
                     f"of {o.get(f'overlap_{k}_s', 0.0):.1f} s")
    mean = o.get("speaker_count_error_mean")
    parts.append(f"speaker count exact {o['speaker_count_exact']}/{o['speaker_count_items']}, mean error "
                 + ("-" if mean is None else f"{mean:+.2f}"))
    return "speakers: " + "; ".join(parts)


def run(args: argparse.Namespace, transcribe_fn: TranscribeFn | None = None) -> int:
    """Run ``diarist eval`` for parsed ``args``; ``transcribe_fn`` overrides the pipeline (tests, callers)."""
    data_dir = Path(args.data_dir)
    if not data_dir.is_dir():
        print(f"diarist eval: data directory not found: {data_dir}", file=sys.stderr)
        return 2
    if args.out and Path(args.out).is_dir():
        print(f"diarist eval: --out is a directory; give a file name, e.g. {Path(args.out) / 'report.json'}",
              file=sys.stderr)
        return 2
    missing = [m for m in ("jiwer", "meeteval", "pyannote.metrics", "pyannote.database")
               if importlib.util.find_spec(m) is None]
    if missing:
        print(f"diarist eval: missing scoring packages {missing}; install them with: pip install 'diarist[eval]'",
              file=sys.stderr)
        return 2
    timing = "wall"
    if transcribe_fn is None:
        if args.hyp_dir:
            if not Path(args.hyp_dir).is_dir():
                print(f"diarist eval: --hyp-dir not found: {args.hyp_dir}", file=sys.stderr)
                return 2
            transcribe_fn, timing = replay_transcribe_fn(args.hyp_dir, data_dir), "reported"
        else:
            from engine.config import (
                DeviceUnavailable,  # torch-free; not at import: eval runs without the engine
            )

            try:
                transcribe_fn = engine_transcribe_fn(args.model, args.model_path, args.device,
                                                     getattr(args, "diarize", True))
            except DeviceUnavailable:
                raise  # the CLI's one line for every entry point, exit 2
            except Exception as e:  # noqa: BLE001 - no model files, unknown family, no CUDA...: say so, no traceback
                print(f"diarist eval: cannot start the {args.model!r} pipeline: {type(e).__name__}: {e}",
                      file=sys.stderr)
                return 2
    collars = tuple(args.collar) if args.collar else DEFAULT_COLLARS

    from cli.progress import EvalProgress, shows_progress  # rich: loaded only by the commands that draw

    quiet = getattr(args, "quiet", False)
    with ExitStack() as stack:
        display = stack.enter_context(EvalProgress(sys.stderr)) if shows_progress(quiet) else None
        done: list[dict] = []

        def progress(rec: dict) -> None:
            done.append(rec)
            status = rec.get("error") or f"rtf {_fmt(rec.get('rtf'), False)}"
            if display is not None:
                display.item(f"  {rec['id']}: {status}", running_figures(aggregate(done, collars), collars))
            elif not quiet:
                print(f"  {rec['id']}: {status}", file=sys.stderr, flush=True)

        report = evaluate(data_dir, transcribe_fn, collars=collars, patterns=args.items, timing=timing,
                          save_dir=args.save_hyp, on_start=display.start if display else None, on_item=progress)
    if not report["items"]:
        print(f"diarist eval: no items with reference files (.txt/.stm/.rttm beside the audio) in {data_dir}"
              + (f" matching {args.items}" if args.items else ""), file=sys.stderr)
        for n in report["not_scored"]:
            print(f"  {n['id']}: {n['reason']}", file=sys.stderr)
        return 2
    report = {"model": args.model, "model_path": args.model_path, "device": args.device,
              "diarize": getattr(args, "diarize", True),
              "command": " ".join(shlex.quote(a) for a in sys.argv), "git_commit": _git_commit(),
              "created_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"), **report}
    print(format_table(report))
    if report.get("unmatched_references"):
        print(f"diarist eval: reference files with no audio beside them (not scored): "
              f"{', '.join(report['unmatched_references'])}", file=sys.stderr)
    if args.out:
        try:
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            Path(args.out).write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        except OSError as e:
            print(f"diarist eval: cannot write the report to {args.out}: {e}", file=sys.stderr)
            return 1
        print(f"report written to {args.out}", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    """Standalone entry point: ``python -m cli.commands.eval DATA_DIR ...``."""
    p = argparse.ArgumentParser(prog="diarist eval", description=plain(__doc__).splitlines()[0])
    _add_arguments(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
