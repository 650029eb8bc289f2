"""Progress on the terminal for ``diarist transcribe`` and ``diarist eval``, drawn by rich on stderr.

Shown only when stderr is a terminal and ``--quiet`` is not given (:func:`shows_progress`): piped output,
logs and scripts get no progress at all, and stdout (the transcript, the eval table) is never written to,
so it is byte for byte what it is without the display.

``diarist transcribe`` reads the pipeline's own progress events (:mod:`diarist.contract.events`, the ones
the service streams as SSE): ``stage`` names the stage, ``queued`` carries the audio's duration, each
``segment``'s end is the audio done so far, ``finished`` ends it. The estimate of what is left is rich's,
from the rate of audio seconds transcribed over the last 30 s, shown during transcription only: the other
stages report no audio seconds (:class:`RemainingColumn`).
"""

from __future__ import annotations

import math
import sys
import threading
from collections.abc import Iterable, Mapping
from typing import IO, Any, Self

from rich.console import Console, RenderableType
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    Task,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Column
from rich.text import Text

from diarist.contract.events import STAGES

STAGE_LABELS: Mapping[str, str] = {s: s.replace("_", " ") for s in STAGES}
"""What the display calls each pipeline stage (``speech_detection`` -> ``speech detection``)."""
LOADING = "loading model"
"""The label before the pipeline's first stage, while the CLI loads the engine."""
ESTIMATED_STAGE = "transcription"
"""The stage whose events advance the audio seconds (segment ends): the only one with an estimate of the
time left."""
FULL_BEFORE_FINISHED = 0.999
"""The most of the bar that segments fill: the speaker stage still runs after the last one (as the worker's
job progress stops short of 1 until the job is done)."""


def shows_progress(quiet: bool, stream: IO[str] | None = None) -> bool:
    """Whether to draw progress: not ``quiet`` and ``stream`` (default ``sys.stderr``) is a terminal."""
    stream = sys.stderr if stream is None else stream
    return not quiet and hasattr(stream, "isatty") and stream.isatty()


def _progress(stream: IO[str], *columns: str | ProgressColumn, cls: type[Progress] = Progress) -> Progress:
    # The bar takes the width the other columns leave (_bar), so a terminal of 80 columns shows every figure.
    # What is written to stderr while the display runs (an error line, a library's warning) is printed above
    # it by rich; stdout is left alone, so it stays byte for byte what it is without the display.
    console = Console(file=stream, force_terminal=True, highlight=False)
    return cls(*columns, console=console, redirect_stdout=False, redirect_stderr=True, expand=True)


def _bar() -> BarColumn:
    return BarColumn(bar_width=None, table_column=Column(ratio=1))


class AudioSecondsColumn(ProgressColumn):
    """``312/5400 s audio``: seconds of audio done of the recording's duration (``?`` until it is known)."""

    def render(self, task: Task) -> Text:
        total = "?" if task.total is None else f"{task.total:.0f}"
        done = task.total if task.finished else math.floor(task.completed)  # never "131/131" before the end
        return Text(f"{done:>{len(total)}.0f}/{total} s audio")  # a steady width: the bar does not jump


class RemainingColumn(TimeRemainingColumn):
    """rich's estimate of the time left, from the rate of audio seconds done, shown only in the stage that
    advances them (transcription): the stages around it report no seconds, so any figure there would be a
    guess (``-:--:--``)."""

    def render(self, task: Task) -> Text:
        if not task.fields.get("estimating", False) and not task.finished:
            return Text("-:--:--", style="progress.remaining")
        return super().render(task)


class TranscribeProgress:
    """An ``on_event(kind, payload)`` (:data:`transcription.progress.EventFn`) that draws one line on
    ``stream``: stage, bar, audio seconds done/total, elapsed, estimate of what is left.

    Safe to call from the engine's threads (the window decoder emits from its own). Use as a context
    manager: the line is drawn from ``__enter__`` and left in its final state on ``__exit__`` (removed if
    no ``finished`` event came: the command failed and says so on its own line).

    Args:
        stream: a terminal (normally ``sys.stderr``).
        duration: the recording's duration in seconds if known before decoding (a header probe), else
            ``None``; the ``queued`` event's decoded duration replaces it.
    """

    def __init__(self, stream: IO[str], duration: float | None = None) -> None:
        self.progress = _progress(stream, TextColumn("{task.description:<16}"), _bar(), AudioSecondsColumn(),
                                  TextColumn("elapsed"), TimeElapsedColumn(), TextColumn("left"),
                                  RemainingColumn())
        self.task = self.progress.add_task(LOADING, total=duration, estimating=False)
        self.lock = threading.Lock()
        self.finished = False

    def __enter__(self) -> Self:
        self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if not self.finished:  # failed: the error line says what happened, a half-drawn bar would not
            self.progress.update(self.task, visible=False)
        self.progress.stop()

    def __call__(self, kind: str, payload: dict[str, Any]) -> None:
        with self.lock:
            if kind == "stage":
                self.progress.update(self.task, description=STAGE_LABELS.get(payload["stage"], payload["stage"]),
                                     estimating=payload["stage"] == ESTIMATED_STAGE)
            elif kind == "queued":
                self.progress.update(self.task, total=float(payload["duration"]))
            elif kind == "segment" and payload.get("end") is not None:
                task = self.progress.tasks[0]
                done = max(task.completed, float(payload["end"]))
                if task.total is not None:  # full only when finished: rich stops the clock of a full task
                    done = min(done, FULL_BEFORE_FINISHED * task.total)
                self.progress.update(self.task, completed=done)
            elif kind == "finished":
                self.finished = True
                task = self.progress.tasks[0]
                self.progress.update(self.task, description="done", completed=task.total or task.completed)


class _FiguresBelow(Progress):
    """A progress display with one more line under the bar: ``figures`` (rich's documented way to add to
    the display is overriding ``get_renderables``)."""

    figures = ""

    def get_renderables(self) -> Iterable[RenderableType]:
        yield self.make_tasks_table(self.tasks)
        if self.figures:
            yield Text(self.figures)


class EvalProgress:
    """``diarist eval``'s display: items done of the total, elapsed, estimate of what is left, and under it
    the running figures (pooled WER, cpWER, DER, RTF so far: :func:`cli.commands.eval.running_figures`);
    each item's line is printed above both.

    Use as a context manager; call :meth:`start` with the number of items, then :meth:`item` per item.
    """

    def __init__(self, stream: IO[str]) -> None:
        self.progress = _progress(stream, TextColumn("eval"), _bar(), MofNCompleteColumn(),
                                  TextColumn("items elapsed"), TimeElapsedColumn(), TextColumn("left"),
                                  TimeRemainingColumn(), cls=_FiguresBelow)
        self.task = self.progress.add_task("eval", total=None)

    def __enter__(self) -> Self:
        self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()

    def start(self, n_items: int) -> None:
        """``n_items`` items will be run."""
        self.progress.update(self.task, total=n_items)

    def item(self, line: str, figures: str) -> None:
        """One more item is done: ``line`` goes above the display, ``figures`` replace the running figures."""
        self.progress.console.print(line, markup=False)
        self.progress.figures = f"so far: {figures}"
        self.progress.update(self.task, advance=1)
