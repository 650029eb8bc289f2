"""Reference files of a data folder (the layout ``diarist eval`` and the tests read, ``DIARIST_TEST_DATA``).

One folder per item; references sit beside the audio: ``<stem>.txt`` (exact
transcript; empty = no speech expected), ``<stem>.APPROX.txt`` (approximate
transcript), ``<stem>.stm`` (speaker-attributed transcript), ``<stem>.speakers.txt``
(speaker-attributed, in either of two forms: ``speaker: text`` on every line, a transcript of its own,
or one bare speaker label per line of ``<stem>.txt``, in order), ``<stem>.rttm`` (speaker turns),
``<stem>.ch<N>_<name>.txt`` (one
speaker per channel). Several audio files may share one reference (``jfk.flac``/``jfk.mp3``
-> ``jfk.txt``, ``yes_1000ms.wav`` -> ``yes.txt``): the reference named after the longest
prefix of the audio stem cut at ``.`` or ``_`` is used.

Nothing is skipped silently: :func:`discover` returns every audio file, and those without a
reference come with the exact reason (:class:`NotScored`): no reference file in the folder, reference
files whose names match no audio of the folder (named with the rule above), or references that all
belong to other audio files of the folder (a copy renamed so that no reference's name is a prefix of it).
Loading never raises for a bad file: problems become messages in ``References.errors``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from evaluation.scoring import ReferenceFileError

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
    speakers_txt: Path | None = None

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


REFERENCE_SUFFIXES = (".txt", ".stm", ".rttm")
SPEAKERS_SUFFIX = ".speakers.txt"


@dataclass(frozen=True)
class NotScored:
    """An audio file ``id`` that is not scored, and ``reason`` (for people): no reference, or a name mismatch."""

    id: str
    reason: str


def _is_reference(p: Path) -> bool:
    return p.is_file() and p.suffix.lower() in REFERENCE_SUFFIXES


def discover(data_dir: Path) -> tuple[list[Item], list[NotScored]]:
    """Find the items of ``data_dir``: ``(items with references, audio files without, with the reason)``.

    Every audio file is in one of the two lists."""
    items, audio_without = [], []
    for audio in sorted(p for p in data_dir.rglob("*") if p.is_file() and p.suffix.lower() in AUDIO_EXTENSIONS):
        item_id = audio.relative_to(data_dir).as_posix()
        speakers, _ = _find(audio.parent, audio.stem, (SPEAKERS_SUFFIX,))
        txt, suffix = _find(audio.parent, audio.stem, (".txt", ".APPROX.txt"))
        stm, _ = _find(audio.parent, audio.stem, (".stm",))
        rttm, _ = _find(audio.parent, audio.stem, (".rttm",))
        channels = []
        for prefix in _prefixes(audio.stem):
            channels = sorted(audio.parent.glob(f"{glob_escape(prefix)}.ch[0-9]*.txt"))
            if channels:
                break
        item = Item(item_id, audio, txt, suffix == ".APPROX.txt", stm, rttm, channels, speakers)
        if txt or stm or rttm or speakers:
            items.append(item)
        else:
            audio_without.append(item)
    used = _used(items)
    owners: dict[Path, list[str]] = {}
    for i in items:
        for p in (i.txt, i.stm, i.rttm, i.speakers_txt, *i.channel_txts):
            if p is not None:
                owners.setdefault(p, []).append(i.audio.name)
    skipped = []
    naming = ("a reference is named after the audio ({stem}.txt/.stm/.rttm/.speakers.txt) or after a prefix "
              "of its name cut at '.' or '_'")
    for item in audio_without:
        beside = [p for p in sorted(item.audio.parent.iterdir()) if _is_reference(p)]
        strays = [p.name for p in beside if p not in used]
        taken = [f"{p.name} ({', '.join(owners[p])})" for p in beside if p in used]
        rule = naming.format(stem=item.audio.stem)
        if strays:
            reason = f"name mismatch: {', '.join(strays)} beside it match no audio file; {rule}"
        elif taken:
            reason = (f"no reference named after it: the references beside it belong to other audio files: "
                      f"{'; '.join(taken)}; {rule}")
        else:
            reason = "no reference file (.txt, .stm, .rttm or .speakers.txt) beside it"
        skipped.append(NotScored(item.id, reason))
    return items, skipped


def _used(items: list[Item]) -> set[Path]:
    return {p for i in items for p in (i.txt, i.stm, i.rttm, i.speakers_txt, *i.channel_txts) if p is not None}


def unmatched_references(data_dir: Path, items: list[Item]) -> list[str]:
    """Reference files (``.txt``, ``.stm``, ``.rttm``) under ``data_dir`` that no audio file picked up, as
    paths relative to it: usually a reference whose audio is missing or named differently."""
    used = _used(items)
    return sorted(p.relative_to(data_dir).as_posix() for p in data_dir.rglob("*") if _is_reference(p) and p not in used)


def glob_escape(text: str) -> str:
    return re.sub(r"([*?\[])", r"[\1]", text)


@dataclass(frozen=True)
class SpeakerLine:
    """One line of a speaker-attributed reference: ``speaker`` label, ``text``, and ``start``/``end`` seconds
    (``None`` for ``.speakers.txt`` references, which have no times)."""

    speaker: str
    text: str
    start: float | None = None
    end: float | None = None


@dataclass
class References:
    """An item's loaded references: ``text`` (the transcript), ``speaker_lines`` (speaker-attributed, from
    the ``.stm``, else ``.txt`` + ``.speakers.txt``; scored with cpWER), ``speaker_source`` (which file
    gave them), ``rttm`` (a ``pyannote.core.Annotation``) and ``errors`` (messages)."""

    text: str | None = None
    speaker_lines: list[SpeakerLine] | None = None
    speaker_source: str | None = None
    rttm: Any = None
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
            picked = _pick(sessions, stem, item.stm, "STM")
            refs.speaker_lines = [SpeakerLine(line.speaker_id, line.transcript, float(line.begin_time),
                                              float(line.end_time))
                                  for line in sorted(picked.lines, key=lambda x: float(x.begin_time))]
            refs.speaker_source = "stm"
        except ReferenceFileError as e:
            refs.errors.append(str(e))
        except Exception as e:  # noqa: BLE001 - meeteval raises assorted errors for malformed lines
            refs.errors.append(f"cannot parse STM file {item.stm}: {type(e).__name__}: {e}")
    if item.speakers_txt is not None and refs.speaker_lines is None:
        try:
            refs.speaker_lines = _speaker_lines(refs.text, item.speakers_txt.read_text(encoding="utf-8"),
                                                item.speakers_txt)
            refs.speaker_source = "speakers.txt"
            if refs.text is None:  # ``speaker: text`` lines: the transcript itself
                refs.text = "\n".join(line.text for line in refs.speaker_lines)
        except ReferenceFileError as e:
            refs.errors.append(str(e))
        except (OSError, UnicodeDecodeError) as e:
            refs.errors.append(f"cannot read speakers file {item.speakers_txt}: {e}")
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


_SPEAKER_TEXT = re.compile(r"^([^:]{1,64}?)\s*:\s+(\S.*)$")
"""A ``speaker: text`` line: a label of at most 64 characters without a colon, a colon, then the text."""


def _speaker_lines(text: str | None, speakers: str, path: Path) -> list[SpeakerLine]:
    """Speaker-attributed lines of a ``.speakers.txt`` file, in either form: ``speaker: text`` on every
    non-empty line (the file is the transcript), or one bare label per line, paired in order with the
    non-empty lines of the transcript ``text`` (``<stem>.txt``).

    Raises:
        ReferenceFileError: the forms are mixed, bare labels have no transcript, or the counts differ.
    """
    rows = [x.strip() for x in speakers.splitlines() if x.strip()]
    pairs = [_SPEAKER_TEXT.match(r) for r in rows]
    if rows and all(pairs):
        return [SpeakerLine(m.group(1).strip(), m.group(2).strip()) for m in pairs if m]
    if any(pairs):
        n = sum(1 for m in pairs if m)
        raise ReferenceFileError(f"speakers file {path} mixes {n} 'speaker: text' lines with {len(rows) - n} "
                                 "bare labels (use one form: 'speaker: text' on every line, or one label per "
                                 "transcript line)")
    if text is None:
        raise ReferenceFileError(f"speakers file {path} has bare labels but there is no transcript (.txt) for "
                                 "them to label (or write 'speaker: text' on every line)")
    lines = [x.strip() for x in text.splitlines() if x.strip()]
    if len(lines) != len(rows):
        raise ReferenceFileError(f"speakers file {path} has {len(rows)} labels for the {len(lines)} lines of "
                                 "its transcript (one label per transcript line, in order)")
    return [SpeakerLine(spk, line) for spk, line in zip(rows, lines, strict=True)]
