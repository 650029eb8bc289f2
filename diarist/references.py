"""Reference files of a data folder (the layout ``diarist eval`` and the tests read, ``DIARIST_TEST_DATA``).

One folder per item; references sit beside the audio: ``<stem>.txt`` (exact
transcript; empty = no speech expected), ``<stem>.APPROX.txt`` (approximate
transcript), ``<stem>.stm`` (speaker-attributed transcript), ``<stem>.rttm`` (speaker
turns), ``<stem>.ch<N>_<name>.txt`` (one speaker per channel). Several audio files may
share one reference (``jfk.flac``/``jfk.mp3`` -> ``jfk.txt``, ``yes_1000ms.wav`` ->
``yes.txt``): the reference named after the longest prefix of the audio stem cut at
``.`` or ``_`` is used.

Loading never raises for a bad file: problems become messages in ``References.errors``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from diarist.scoring import ReferenceFileError

AUDIO_EXTENSIONS = {".wav", ".flac", ".mp3", ".m4a", ".ogg", ".opus", ".mp4", ".webm", ".aac", ".mka", ".mkv"}


@dataclass
class Item:
    """One recording and the reference files that apply to it (paths may be ``None``)."""

    id: str
    audio: Path
    txt: Path | None = None
    approximate: bool = False
    stm: Path | None = None
    rttm: Path | None = None
    channel_txts: list[Path] = field(default_factory=list)

    @property
    def hints(self) -> dict[str, Any]:
        """Keyword hints passed to ``transcribe_fn`` (``multichannel=True`` for per-channel references)."""
        return {"multichannel": True} if self.channel_txts else {}


def _prefixes(stem: str) -> list[str]:
    """The stem, then shorter prefixes cut before each ``.`` or ``_`` (longest first)."""
    cuts = [m.start() for m in re.finditer(r"[._]", stem)]
    return [stem] + [stem[:i] for i in reversed(cuts) if i > 0]


def _find(directory: Path, stem: str, suffixes: tuple[str, ...]) -> tuple[Path | None, str | None]:
    for prefix in _prefixes(stem):
        for suffix in suffixes:
            p = directory / f"{prefix}{suffix}"
            if p.is_file():
                return p, suffix
    return None, None


def discover(data_dir: Path) -> tuple[list[Item], list[str]]:
    """Find the items of ``data_dir``; returns ``(items with references, ids of audio without)``."""
    items, skipped = [], []
    for audio in sorted(p for p in data_dir.rglob("*") if p.is_file() and p.suffix.lower() in AUDIO_EXTENSIONS):
        item_id = audio.relative_to(data_dir).as_posix()
        txt, suffix = _find(audio.parent, audio.stem, (".txt", ".APPROX.txt"))
        stm, _ = _find(audio.parent, audio.stem, (".stm",))
        rttm, _ = _find(audio.parent, audio.stem, (".rttm",))
        channels = []
        for prefix in _prefixes(audio.stem):
            channels = sorted(audio.parent.glob(f"{glob_escape(prefix)}.ch[0-9]*.txt"))
            if channels:
                break
        item = Item(item_id, audio, txt, suffix == ".APPROX.txt", stm, rttm, channels)
        if txt or stm or rttm:
            items.append(item)
        else:
            skipped.append(item_id)
    return items, skipped


def unmatched_references(data_dir: Path, items: list[Item]) -> list[str]:
    """Reference files (``.txt``, ``.stm``, ``.rttm``) under ``data_dir`` that no audio file picked up, as
    paths relative to it: usually a reference whose audio is missing or named differently."""
    used = {p for i in items for p in (i.txt, i.stm, i.rttm, *i.channel_txts) if p is not None}
    return sorted(p.relative_to(data_dir).as_posix() for p in data_dir.rglob("*")
                  if p.is_file() and p.suffix.lower() in (".txt", ".stm", ".rttm") and p not in used)


def glob_escape(text: str) -> str:
    return re.sub(r"([*?\[])", r"[\1]", text)


@dataclass
class References:
    text: str | None = None
    stm: Any = None  # meeteval.io.STM, one session
    rttm: Any = None  # pyannote.core.Annotation
    errors: list[str] = field(default_factory=list)


def _pick(by_name: dict, audio_stem: str, path: Path, kind: str) -> Any:
    for prefix in _prefixes(audio_stem):
        if prefix in by_name:
            return by_name[prefix]
    if len(by_name) == 1:
        return next(iter(by_name.values()))
    raise ReferenceFileError(
        f"{kind} file {path} has recordings {sorted(by_name)} but none named after the audio {audio_stem!r}")


def _check_rttm_times(text: str, path: Path) -> None:
    """``ReferenceFileError`` for a ``SPEAKER`` line whose onset is negative or whose duration is not
    positive (pyannote would drop or flip such a turn, silently changing DER)."""
    for n, line in enumerate(text.splitlines(), 1):
        f = line.split()
        if len(f) >= 5 and f[0] == "SPEAKER":
            try:
                start, dur = float(f[3]), float(f[4])
            except ValueError:
                continue  # load_rttm reports unparsable fields
            if start < 0 or not dur > 0:
                raise ReferenceFileError(f"RTTM file {path} line {n}: a turn needs onset >= 0 and duration > 0, "
                                         f"got onset {f[3]} and duration {f[4]}")


def load_references(item: Item) -> References:
    """Read the item's reference files; problems are collected as messages in ``errors``, never raised."""
    refs = References()
    stem = item.audio.stem
    if item.txt is not None:
        try:
            refs.text = item.txt.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            refs.errors.append(f"cannot read transcript {item.txt}: {e}")
    if item.stm is not None:
        try:
            from meeteval.io import STM

            stm = STM.load(item.stm)
            sessions = {name: STM([line for line in stm.lines if line.filename == name])
                        for name in dict.fromkeys(line.filename for line in stm.lines)}
            if not sessions:
                raise ReferenceFileError(f"STM file {item.stm} has no segments")
            refs.stm = _pick(sessions, stem, item.stm, "STM")
        except ReferenceFileError as e:
            refs.errors.append(str(e))
        except Exception as e:  # noqa: BLE001 - meeteval raises assorted errors for malformed lines
            refs.errors.append(f"cannot parse STM file {item.stm}: {type(e).__name__}: {e}")
    if item.rttm is not None:
        try:
            from pyannote.core import Annotation
            from pyannote.database.util import load_rttm

            text = item.rttm.read_text(encoding="utf-8")
            if not text.strip():
                refs.rttm = Annotation(uri=stem)  # an empty RTTM says: nobody speaks
            else:
                _check_rttm_times(text, item.rttm)
                refs.rttm = _pick(load_rttm(item.rttm), stem, item.rttm, "RTTM")
        except ReferenceFileError as e:
            refs.errors.append(str(e))
        except Exception as e:  # noqa: BLE001 - pandas/pyannote raise assorted errors for malformed lines
            refs.errors.append(f"cannot parse RTTM file {item.rttm} (expected 10 fields 'SPEAKER <file-id> 1 "
                               f"<start> <dur> <NA> <NA> <speaker> <NA> <NA>'): {type(e).__name__}: {e}")
    return refs
