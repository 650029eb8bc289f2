"""MOSS-TD prompt: ChatML with the audio span (``<|audio_pad|>`` tokens interleaved with time markers).

Format (OpenMOSS ``processing_moss_transcribe_diarize.py`` and
``inference_utils.py``, Apache-2.0): the rendered chat is ::

    <|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n<|im_start|>user\\n
    <|audio_start|><|audio_pad|><|audio_end|>\\n{instruction}<|im_end|>\\n<|im_start|>assistant\\n

It is split at the single ``<|audio_pad|>``; the text before and after is encoded separately without
special-token insertion, and the audio span goes between. The span has one ``<|audio_pad|>`` per audio
token, ``(samples - 1) // 1280 + 1`` per 30 s window (1280 = hop 160 x conv stride 2 x merge 4, so
12.5 tokens/s), and after every ``12.5 * every_s`` audio tokens the decimal digits of the elapsed whole
seconds (absolute over the recording) as single digit tokens, for every multiple of ``every_s`` up to
``int(N / 12.5)``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from engine.models.mel import CHUNK_SAMPLES, HOP_LENGTH, SAMPLE_RATE

SAMPLES_PER_TOKEN = HOP_LENGTH * 2 * 4
"""Samples behind one audio token (1280): mel hop x the encoder's conv stride 2 x the adapter's 4-frame merge."""
TOKENS_PER_SECOND = SAMPLE_RATE / SAMPLES_PER_TOKEN  # 12.5
DEFAULT_MARKER_EVERY_S = 2
AUDIO_PAD = "<|audio_pad|>"

SYSTEM_PROMPT = "You are a helpful assistant."
# The released default instruction (OpenMOSS inference_utils.py DEFAULT_PROMPT, Apache-2.0). In English:
# "Transcribe the audio; start each segment with its start timestamp and speaker ID ([S01], [S02], [S03]…),
# then the speech, and end the segment with its end timestamp, so that each segment's span is clear."
DEFAULT_INSTRUCTION = (
    "请将音频转写为文本，每一段需以起始时间戳和说话人编号"
    "（[S01]、[S02]、[S03]…）开头，正文为对应的语音内容，"
    "并在段末标注结束时间戳，以清晰标明该段语音范围。"
)


def window_token_counts(num_samples: int) -> list[int]:
    """Audio tokens of each 30 s window of a recording of ``num_samples`` 16 kHz samples
    (``(samples - 1) // 1280 + 1`` each; a full window gives 375). Empty audio gives ``[]``."""
    counts = []
    for start in range(0, num_samples, CHUNK_SAMPLES):
        n = min(CHUNK_SAMPLES, num_samples - start)
        counts.append((n - 1) // SAMPLES_PER_TOKEN + 1)
    return counts


def audio_span_ids(num_audio: int, audio_id: int, digit_ids: list[int], every_s: int | None) -> list[int]:
    """The audio span: ``num_audio`` copies of ``audio_id`` with time-marker digits inserted.

    Args:
        num_audio: audio tokens N of the whole recording.
        audio_id: the ``<|audio_pad|>`` id (151671).
        digit_ids: ids of the characters ``"0".."9"`` (15..24 for Qwen3).
        every_s: marker interval in seconds; ``None`` or 0 disables markers.
    Returns:
        Token ids; exactly ``num_audio`` of them are ``audio_id``.
    """
    if not every_s or num_audio <= 0:
        return [audio_id] * max(num_audio, 0)
    per_marker = int(TOKENS_PER_SECOND * every_s)
    duration = int(num_audio / TOKENS_PER_SECOND)
    out: list[int] = []
    used = 0
    for sec in range(every_s, duration + 1, every_s):
        upto = (sec // every_s) * per_marker
        out.extend([audio_id] * (upto - used))
        used = upto
        out.extend(digit_ids[int(c)] for c in str(sec))
    out.extend([audio_id] * (num_audio - used))
    return out


class ChatTemplate:
    """A checkpoint's Jinja chat template, rendered as Hugging Face ``apply_chat_template`` renders it
    (sandboxed environment with ``trim_blocks``/``lstrip_blocks``, loop controls, ``tojson``,
    ``raise_exception``) for the official message (OpenMOSS ``build_transcription_messages``): one user turn
    holding the audio item, then the instruction, with the generation prompt.

    Args:
        text: the Jinja source. source: where it came from (a file name), for stats and errors.
        special_tokens: the tokenizer's named special tokens (``{"eos_token": "<|im_end|>", ...}``,
            :func:`read_special_tokens`), variables of the template as ``apply_chat_template`` passes them.

    Raises:
        ValueError: the template does not compile, fails to render, or does not give exactly one
            ``<|audio_pad|>``.
    """

    def __init__(self, text: str, source: str, special_tokens: dict[str, str] | None = None) -> None:
        import jinja2
        import jinja2.ext
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message: str) -> None:
            raise jinja2.exceptions.TemplateError(message)

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                            extensions=[jinja2.ext.loopcontrols])
        env.filters["tojson"] = lambda x, indent=None, **_: json.dumps(x, ensure_ascii=False, indent=indent)
        env.globals["raise_exception"] = raise_exception
        self.text, self.source = text, source
        self.special_tokens = dict(special_tokens or {})
        try:
            self._template = env.from_string(text)
        except jinja2.exceptions.TemplateError as e:
            raise ValueError(f"{source}: the chat template does not compile: {e}") from None
        self.render(None)  # fails at load, not on the first request

    def render(self, instruction: str | None) -> str:
        """The rendered string with one ``<|audio_pad|>``; an empty instruction uses the default."""
        import jinja2

        text = (instruction or "").strip() or DEFAULT_INSTRUCTION
        messages = [{"role": "user", "content": [{"type": "audio", "audio": "audio"}, {"type": "text", "text": text}]}]
        try:
            out = self._template.render(**self.special_tokens, messages=messages, add_generation_prompt=True)
        except jinja2.exceptions.TemplateError as e:
            raise ValueError(f"{self.source}: the chat template failed to render: {e}") from None
        if out.count(AUDIO_PAD) != 1:
            raise ValueError(f"{self.source}: the chat template renders {out.count(AUDIO_PAD)} {AUDIO_PAD} "
                             f"placeholders for one audio item (expected 1)")
        return out


def render_chat(instruction: str | None = None, template: ChatTemplate | None = None) -> str:
    """The rendered chat string with one ``<|audio_pad|>``; an empty instruction uses the default.
    ``template``: the checkpoint's (:class:`ChatTemplate`); ``None`` renders the released format built in."""
    if template is not None:
        return template.render(instruction)
    text = (instruction or "").strip() or DEFAULT_INSTRUCTION
    return (f"<|im_start|>system\n{SYSTEM_PROMPT}<|im_end|>\n<|im_start|>user\n"
            f"<|audio_start|>{AUDIO_PAD}<|audio_end|>\n{text}<|im_end|>\n<|im_start|>assistant\n")


TEMPLATE_FILES = ("chat_template.jinja", "chat_template.json", "processor_config.json", "tokenizer_config.json")
"""Where a folder's chat template is looked for, first found wins (the processor's own files first, as
``ProcessorMixin.from_pretrained`` loads them; the tokenizer's template last)."""


SPECIAL_TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
"""The named special tokens a Hugging Face tokenizer passes to its chat template
(``PreTrainedTokenizerBase.SPECIAL_TOKENS_ATTRIBUTES``; ``special_tokens_map``)."""


def _json_object(p: Path) -> dict:
    try:
        data = json.loads(p.read_text())
    except ValueError as e:
        raise ValueError(f"{p}: not valid JSON: {e}") from None
    if isinstance(data, dict):
        return data
    raise ValueError(f"{p}: not a JSON object")  # a CheckpointError at load (engine.loaders.moss_td)


def _token_text(value: object) -> str | None:
    """A special token as ``tokenizer_config.json`` writes it: a string, or a serialised ``AddedToken``
    (``{"content": ...}``); ``None`` for anything else (an unset token)."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def read_special_tokens(model_dir: str | Path | None) -> dict[str, str]:
    """The folder's named special tokens as ``apply_chat_template`` passes them to the template
    (transformers ``special_tokens_map``): :data:`SPECIAL_TOKEN_NAMES` and the model-specific ones of an
    ``extra_special_tokens`` mapping, from ``tokenizer_config.json``, overridden by ``special_tokens_map.json``
    as transformers' loader merges the two; unset tokens (``null``) are left out, so the template sees them
    undefined. Empty without a folder or the files.

    Raises:
        ValueError: a file that is not a JSON object.
    """
    out: dict[str, str] = {}
    if model_dir is None:
        return out
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        p = Path(model_dir) / name
        if not p.is_file():
            continue
        data = _json_object(p)
        extra = data.get("extra_special_tokens")
        named = {k: data[k] for k in SPECIAL_TOKEN_NAMES if k in data}
        for key, value in {**named, **(extra if isinstance(extra, dict) else {})}.items():
            text = _token_text(value)
            if text is None:
                out.pop(key, None)
            else:
                out[key] = text
    return out


def read_chat_template(model_dir: str | Path | None) -> ChatTemplate | None:
    """The folder's chat template (:data:`TEMPLATE_FILES`: a ``.jinja`` file, or a ``chat_template`` string
    in a JSON file), rendered with the folder's special tokens (:func:`read_special_tokens`), or ``None``
    when there is none (the built-in format is then used).

    Raises:
        ValueError: a template that does not compile or render one audio placeholder; unreadable JSON.
    """
    if model_dir is None:
        return None
    for name in TEMPLATE_FILES:
        p = Path(model_dir) / name
        if not p.is_file():
            continue
        if name.endswith(".jinja"):
            return ChatTemplate(p.read_text(), name, read_special_tokens(model_dir))
        try:
            value = json.loads(p.read_text()).get("chat_template")
        except (ValueError, AttributeError) as e:
            raise ValueError(f"{p}: not a JSON object: {e}") from None
        if isinstance(value, str) and value.strip():
            return ChatTemplate(value, name, read_special_tokens(model_dir))
    return None


@dataclass
class MossPrompt:
    """Prompt ids and the facts derived with them: ``num_audio`` pads, ``window_tokens`` per window."""

    ids: list[int]
    num_audio: int
    window_tokens: list[int]


def build_prompt(tokenizer, num_samples: int, instruction: str | None = None,
                 marker_every_s: int | None = DEFAULT_MARKER_EVERY_S,
                 template: ChatTemplate | None = None) -> MossPrompt:
    """Prompt ids for a recording of ``num_samples`` 16 kHz samples (``template``: the checkpoint's chat
    template, ``None`` for the built-in one).

    ``tokenizer`` needs ``encode(text) -> ids`` (no special-token insertion; ChatML tokens are added tokens)
    and ``token_to_id``. Raises ValueError when a digit is not one token or ``<|audio_pad|>`` is unknown.
    """
    audio_id = tokenizer.token_to_id(AUDIO_PAD)
    if audio_id is None:
        raise ValueError("the tokenizer has no <|audio_pad|> token (not a MOSS-TD tokenizer)")
    digits = []
    for d in "0123456789":
        ids = tokenizer.encode(d)
        if len(ids) != 1:
            raise ValueError(f"digit {d!r} is not a single token: {ids}")
        digits.append(ids[0])
    before, after = render_chat(instruction, template).split(AUDIO_PAD)
    counts = window_token_counts(num_samples)
    n = sum(counts)
    span = audio_span_ids(n, audio_id, digits, marker_every_s)
    ids = tokenizer.encode(before) + span + tokenizer.encode(after)
    return MossPrompt(ids=ids, num_audio=n, window_tokens=counts)


def read_marker_interval(model_dir: str | Path | None) -> tuple[int, str] | None:
    """Time-marker interval (seconds) the checkpoint folder states, with the file that states it, or
    ``None`` when no file does (then the caller decides, loudly: :func:`engine.loaders.moss_td.load_moss_td`).

    Read from ``processor_config.json`` or ``preprocessor_config.json`` (key ``time_marker_every_seconds``,
    top level or one level down); ``enable_time_marker: false`` gives 0 (no markers).
    """
    if model_dir is None:
        return None
    for name in ("processor_config.json", "preprocessor_config.json"):
        p = Path(model_dir) / name
        if not p.is_file():
            continue
        data = json.loads(p.read_text())
        for d in [data, *(v for v in data.values() if isinstance(v, dict))]:
            if d.get("enable_time_marker") is False:
                return 0, name
            if "time_marker_every_seconds" in d:
                return int(d["time_marker_every_seconds"]), name
    return None
