"""Which language a Whisper window is decoded in, and whether it transcribes or translates.

* English-only checkpoints (tiny.en) have no language tokens, hence no detector: they accept
  ``language=en`` (or none) and ``task=transcribe`` only; any other request is refused
  (``unsupported_language``, ``unsupported_task``) instead of producing English-sounding text. Their
  result says the language was ``assumed``.
* Multilingual checkpoints (base) decode in the requested language when one is given (``requested``);
  otherwise the language is detected in **every window** as OpenAI's ``whisper.decoding.detect_language``
  does: at the decoder step after ``<|startoftranscript|>``, a softmax over the language-token logits only,
  the most probable language wins. That step is the window's own first step (its language token is then
  forced, :class:`transcription.whisper.decoding.WindowStart`), so detection costs no extra encoder pass,
  and a recording that switches language is transcribed in each language. Each segment carries its window's
  language; the recording's ``language`` (``detected``) is the one of the most transcribed seconds, its
  probability the seconds-weighted mean of those windows', and ``languages`` lists the seconds of each.
* ``task="translate"`` (``<|translate|>``: speech in any language, English text out) is used only when a
  request asks for it; the default is ``transcribe``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch

from diarist.contract.options import TASKS
from engine.request import RequestRejected
from engine.tokenizer import TextTokenizer
from transcription.whisper.decoding import WhisperTokens

Task = Literal[TASKS]  # type: ignore[valid-type] - the contract's one list

LanguageSource = Literal["requested", "detected", "assumed"]

CHARACTER_LANGUAGES = frozenset({"zh", "ja", "th", "lo", "my", "yue"})
"""Languages written without spaces between words: their word timestamps are per character (OpenAI
whisper ``Tokenizer.split_to_word_tokens``), so speaker changes can fall inside a segment."""


@dataclass(frozen=True)
class LanguageChoice:
    """The language a recording is decoded in.

    Attributes:
        code: Whisper language code (ISO 639-1 where one exists), e.g. ``"zh"``; ``None`` when a
            multilingual model found no speech to detect it on.
        source: ``requested`` (the request's ``language``), ``detected`` (language-token probabilities),
            ``assumed`` (an English-only model, which cannot tell).
        probability: the detected language's probability in [0, 1] (``detected`` only).
        task: ``transcribe`` or ``translate``.
    """

    code: str | None
    source: LanguageSource | None
    probability: float | None = None
    task: Task = "transcribe"

    def result_fields(self) -> dict:
        """The fields this choice contributes to a transcription result."""
        return {"language": self.code, "language_source": self.source, "language_probability": self.probability,
                "task": self.task}


class WhisperLanguages:
    """The language tokens of one Whisper checkpoint, read from its tokenizer.

    Args:
        tokenizer: the checkpoint's tokenizer (``<|xx|>`` language tokens).
        tokens: its special ids (:class:`WhisperTokens`).
        lang_ids: the checkpoint's language token ids (CTranslate2 ``config.json`` ``lang_ids``, Hugging Face
            ``generation_config.json`` ``lang_to_id``); empty for an English-only checkpoint, or for an
            export that does not list them: then the ids from ``<|en|>`` up to ``<|translate|>`` are read.
    """

    def __init__(self, tokenizer: TextTokenizer, tokens: WhisperTokens, lang_ids: list[int]) -> None:
        self.tokens = tokens
        self.id_of: dict[str, int] = {}
        if not tokens.english_only:
            for i in lang_ids or range(tokens.language_base, tokens.translate):
                name = tokenizer.decode([i], skip_special_tokens=False)
                if name.startswith("<|") and name.endswith("|>"):
                    self.id_of[name[2:-2]] = i
        self.code_of = {i: c for c, i in self.id_of.items()}
        self._ids = torch.tensor(sorted(self.code_of), dtype=torch.long)

    @property
    def can_detect(self) -> bool:
        return bool(self.id_of)

    @property
    def codes(self) -> tuple[str, ...]:
        """Codes in token order; ``("en",)`` for an English-only checkpoint."""
        return tuple(self.code_of[i] for i in sorted(self.code_of)) if self.id_of else ("en",)

    def check(self, language: str | None, task: str, model_name: str | None) -> None:
        """Refuse what this checkpoint cannot do, before any audio is decoded.

        Raises:
            RequestRejected: ``unsupported_language`` (a language it does not transcribe),
                ``unsupported_task`` (a task other than transcribe/translate, or translate on an English-only
                model, which has no translate token trained).
        """
        if task not in TASKS:
            raise RequestRejected("unsupported_task", f"task must be one of {', '.join(TASKS)}; got {task!r}")
        if not self.can_detect:
            if language and language.lower() not in ("en", "english"):
                raise RequestRejected("unsupported_language", f"{model_name} transcribes English only; "
                                      f"language={language!r} was asked for")
            if task == "translate":
                raise RequestRejected("unsupported_task", f"{model_name} is English-only and cannot translate; "
                                      "serve a multilingual model (model_path=base)")
            return
        if language and language.lower() not in self.id_of:
            raise RequestRejected("unsupported_language", f"{model_name} has no language {language!r}; it knows "
                                  f"{', '.join(self.codes)}")

    def prompt_ids(self, choice: LanguageChoice) -> tuple[int | None, int | None]:
        """``(language token, task token)`` for :func:`transcription.whisper.decoding.whisper_prompt`;
        ``(None, None)`` on an English-only checkpoint (its prompt has neither)."""
        if not self.can_detect:
            return None, None
        lang = self.id_of.get(choice.code or "en", self.id_of.get("en"))
        return lang, self.tokens.translate if choice.task == "translate" else self.tokens.transcribe

    def choose(self, language: str | None, task: Task, detect: Callable[[], LanguageChoice | None]
               ) -> LanguageChoice:
        """The choice for a request: the requested language, the assumed English, or ``detect()`` (called
        only on a multilingual checkpoint without a requested language; ``None``: nothing to detect on)."""
        if not self.can_detect:
            return LanguageChoice("en", "requested" if language else "assumed", None, task)
        if language:
            return LanguageChoice(language.lower(), "requested", None, task)
        found = detect()
        return LanguageChoice(found.code, "detected", found.probability, task) if found else \
            LanguageChoice(None, None, None, task)

    @property
    def ids(self) -> torch.Tensor:
        """int64 ``[languages]``: the language token ids, in token order (a detection's candidates,
        :class:`transcription.whisper.decoding.WindowStart`)."""
        return self._ids
