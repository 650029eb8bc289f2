"""What a caller asks of one transcription: :class:`TranscribeOptions`, the one list of options a job passes
to the engine (:data:`OPTION_FIELDS`), and the speaker-hint rule (:func:`check_hints`).

The API's request schema (``api.schemas.JobOptions``), the worker's engine client, the engine server and the
pipeline all take the option names from here.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from diarist.contract.errors import InvalidRequest

TASKS = ("transcribe", "translate")
"""``task`` values: text in the speech's language, or English text (multilingual Whisper only)."""
MAX_TEMPERATURE = 1.0
"""Largest ``temperature`` a request may ask for (OpenAI's range is 0..1)."""
MAX_SPEAKERS = 64
"""Largest speaker count a hint may name (``num_speakers``, ``min_speakers``, ``max_speakers``)."""



def _job(default: Any, kind: type) -> Any:
    """A field that is a job option (sent by the worker to the engine) whose JSON value is of type ``kind``."""
    return field(default=default, metadata={"job": kind})


@dataclass
class TranscribeOptions:
    """Per-request options (names follow OpenAI / AssemblyAI).

    Attributes:
        language: ISO 639-1 code of the speech. An English-only Whisper (tiny.en) refuses any other
            (``unsupported_language``) instead of writing English-sounding text for it; a multilingual one
            decodes in it, and detects the language when it is ``None`` (``transcription.language``).
        task: one of :data:`TASKS` (``translate``: multilingual Whisper only, else ``unsupported_task``).
        prompt: text that conditions the decoder (vocabulary, spelling).
        num_speakers / min_speakers / max_speakers: hints for speaker clustering (:func:`check_hints`).
        multichannel: one speaker per channel: transcribe each channel, label by channel.
        temperature: the first decoding temperature (OpenAI ``temperature``, 0..1; ``None`` or 0: greedy
            first). A decode that fails its checks is tried again at higher temperatures, 0.2 apart
            (:func:`transcription.decode_quality.temperature_schedule`), each draw seeded so that a
            recording transcribes the same way on every run.
        max_new_tokens: output budget per sequence (tokens); default from the model and duration.
        diarize: run the speaker cascade (Whisper); False labels everything as one speaker.
        word_timestamps: compute word times (needed to split segments at speaker changes).
        admission_class: the engine admission class of every sequence of this request
            (``engine.request.ADMISSION_CLASSES``: the job's duration class, ``short`` or ``long``, or
            ``default``); the engine admits each class against its own limit. On the wire it travels in its
            own header, not among the options.

    The fields marked as job options (:data:`OPTION_FIELDS`) are what a job carries to the engine; the others
    are set by the process that runs the transcription (the CLI, benchmarks, the engine server).
    """

    language: str | None = _job(None, str)
    task: str = _job("transcribe", str)
    prompt: str | None = _job(None, str)
    num_speakers: int | None = _job(None, int)
    min_speakers: int | None = _job(None, int)
    max_speakers: int | None = _job(None, int)
    multichannel: bool = _job(False, bool)
    temperature: float | None = _job(None, float)
    max_new_tokens: int | None = None
    diarize: bool = True
    word_timestamps: bool = True
    admission_class: str = "default"

    def to_json(self) -> dict[str, Any]:
        """The job options that differ from their defaults, as a JSON object: what a worker sends
        (:meth:`from_json` of it gives these options back, less the fields that are not job options)."""
        return {k: v for k in OPTION_FIELDS if (v := getattr(self, k)) != _DEFAULTS[k]}

    @classmethod
    def from_json(cls, raw: Any, **local: Any) -> TranscribeOptions:
        """Options from a job's JSON options (a worker's header, a stored job's ``options``), checked.

        Keys that are not job options (:data:`OPTION_FIELDS`: a job's ``model``, ``webhook_url``) are
        ignored, as is ``None``; ``local`` sets the other fields (``admission_class=...``).

        Raises:
            InvalidRequest: not an object, an option of the wrong type, or speaker hints that break
                :func:`check_hints`. (A ``task`` or ``language`` the model cannot do is the pipeline's to
                refuse, with ``unsupported_task`` / ``unsupported_language``.)
        """
        if not isinstance(raw, dict):
            raise InvalidRequest(f"options must be a JSON object, not {type(raw).__name__}")
        given = {k: raw[k] for k in OPTION_FIELDS if raw.get(k) is not None}
        for k, v in given.items():
            kind = _TYPES[k]
            if kind is float and isinstance(v, int) and not isinstance(v, bool):
                given[k] = v = float(v)  # JSON writes 0.0 as 0
            if not isinstance(v, kind) or (kind in (int, float) and isinstance(v, bool)):
                raise InvalidRequest(f"options: {k} must be {_TYPE_NAMES[kind]}, not {v!r}")
        if not 0.0 <= given.get("temperature", 0.0) <= MAX_TEMPERATURE:
            raise InvalidRequest(f"options: temperature must be between 0 and {MAX_TEMPERATURE:g}, "
                                 f"not {given['temperature']!r}")
        try:
            check_hints(given.get("num_speakers"), given.get("min_speakers"), given.get("max_speakers"))
        except ValueError as e:
            raise InvalidRequest(f"options: {e}") from None
        return cls(**given, **local)


OPTION_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(TranscribeOptions) if f.metadata.get("job"))
"""Job options a worker passes to the engine (in :class:`TranscribeOptions` order); the rest of a job's
options (``model``, ``webhook_url``) stay in the service."""
_DEFAULTS: dict[str, Any] = {f.name: f.default for f in fields(TranscribeOptions) if f.metadata.get("job")}
_TYPES: dict[str, type] = {f.name: f.metadata["job"] for f in fields(TranscribeOptions) if f.metadata.get("job")}
_TYPE_NAMES = {str: "a string", int: "an integer", float: "a number", bool: "true or false"}


def check_hints(num_speakers: int | None, min_speakers: int | None, max_speakers: int | None) -> None:
    """Check speaker-count hints: each in ``1..MAX_SPEAKERS``, ``min_speakers <= max_speakers``, and
    ``num_speakers`` between them.

    Raises:
        ValueError: a hint that breaks one of those rules (the message names it).
    """
    for name, v in (("num_speakers", num_speakers), ("min_speakers", min_speakers), ("max_speakers", max_speakers)):
        if v is not None and not 1 <= v <= MAX_SPEAKERS:
            raise ValueError(f"{name} must be between 1 and {MAX_SPEAKERS}, got {v}")
    if min_speakers is not None and max_speakers is not None and min_speakers > max_speakers:
        raise ValueError(f"min_speakers ({min_speakers}) > max_speakers ({max_speakers})")
    if num_speakers is not None and ((min_speakers is not None and num_speakers < min_speakers)
                                     or (max_speakers is not None and num_speakers > max_speakers)):
        raise ValueError(f"num_speakers must lie between min_speakers and max_speakers "
                         f"({min_speakers or 1}..{max_speakers or MAX_SPEAKERS}), got {num_speakers}")
