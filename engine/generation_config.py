"""A checkpoint's ``generation_config.json`` as greedy decoding sees it: what we apply, what cannot change a
greedy output, and what we refuse.

The official MOSS-TD path (OpenMOSS ``inference_utils.generate_transcription``) copies the checkpoint's
generation config, forces ``do_sample=False`` and calls Hugging Face ``generate``; every field that changes
the greedy tokens must therefore act here too, and a field we do not implement must stop the load rather
than be dropped. Field semantics follow ``transformers.GenerationConfig`` and the logits processors that
``generate`` builds from it (``RepetitionPenaltyLogitsProcessor``, ``SuppressTokensLogitsProcessor``,
``NoBadWordsLogitsProcessor``).

Torch-free: parsed at load, applied on the device by :class:`engine.logits_rules.GreedyLogitsRules` and by
the request's budget.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.checkpoints import CheckpointError


class GenerationConfigError(CheckpointError):
    """``generation_config.json`` asks for something the engine does not do (the message names the field
    and the value), or is not valid JSON (a :class:`CheckpointError`: code ``bad_model``, one CLI line)."""


# Applied: the stop ids, the penalty, suppressed ids, the output budget's floor.
APPLIED = frozenset({"eos_token_id", "repetition_penalty", "suppress_tokens", "bad_words_ids", "max_new_tokens"})
# No effect on greedy tokens: sampling knobs (the official path forces do_sample=False), beam-only knobs,
# ids used for padding or starting, output/caching/runtime switches, assisted and speculative decoding
# (they need a draft model or heads the official call never passes, and keep greedy tokens when they act),
# and metadata. ``max_length`` too: every request here has an output budget (the request's
# ``max_new_tokens`` or the default one, :func:`transcription.limits.default_budget`), and HF ``generate``
# lets ``max_new_tokens`` win over ``max_length`` (``_prepare_generated_length``: max_length becomes prompt +
# max_new_tokens), as the official call, which passes ``max_new_tokens``, sees it.
NO_EFFECT = frozenset({
    "do_sample", "temperature", "top_p", "top_k", "min_p", "typical_p", "epsilon_cutoff", "eta_cutoff",
    "top_h", "length_penalty", "early_stopping", "diversity_penalty", "num_return_sequences", "max_length",
    "pad_token_id", "bos_token_id", "decoder_start_token_id", "transformers_version", "_from_model_config",
    "use_cache", "cache_implementation", "cache_config", "return_legacy_cache", "output_attentions",
    "output_hidden_states", "output_scores", "output_logits", "return_dict_in_generate", "renormalize_logits",
    "remove_invalid_values", "low_memory", "prompt_lookup_num_tokens", "compile_config", "disable_compile",
    "max_cache_len", "prefill_chunk_size", "continuous_batching_config", "generation_kwargs", "use_mtp",
    "is_assistant", "num_assistant_tokens", "num_assistant_tokens_schedule", "assistant_confidence_threshold",
    "max_matching_ngram_size", "assistant_early_exit", "assistant_lookbehind", "target_lookbehind",
    "assistant_ensemble_weight", "speculation_type",
})
# Fields that change greedy output, accepted only at the value that makes them do nothing (transformers
# writes every field of GenerationConfig at its default with ``use_diff=False``: ``None`` in 5.x, the
# neutral value in 4.x).
NEUTRAL: dict[str, tuple[Any, ...]] = {
    "no_repeat_ngram_size": (None, 0), "encoder_no_repeat_ngram_size": (None, 0), "num_beams": (None, 1),
    "num_beam_groups": (None, 1), "min_length": (None, 0), "min_new_tokens": (None, 0),
    "begin_suppress_tokens": (None, []), "forced_bos_token_id": (None,), "forced_eos_token_id": (None,),
    "forced_decoder_ids": (None, []), "encoder_repetition_penalty": (None, 1.0), "sequence_bias": (None, {}),
    "exponential_decay_length_penalty": (None,), "stop_strings": (None, [], ""), "penalty_alpha": (None,),
    "guidance_scale": (None, 1.0), "watermarking_config": (None,), "dola_layers": (None,), "max_time": (None,),
    "token_healing": (None, False), "constraints": (None, []), "force_words_ids": (None, []),
}


@dataclass(frozen=True)
class GreedyRules:
    """What greedy decoding must do for this checkpoint.

    Attributes:
        eos_token_ids: ids that end a sequence.
        repetition_penalty: HF ``repetition_penalty`` (1.0: none): a logit of a token already in the
            sequence (prompt included, as HF does for decoder-only models) is divided by it when positive
            and multiplied by it when negative.
        suppress_ids: ids never generated (``suppress_tokens`` plus single-token ``bad_words_ids``).
        max_new_tokens: the checkpoint's output budget; ``None`` when not stated.
        source: the file read, or ``None`` (no file: the defaults).
    """

    eos_token_ids: tuple[int, ...]
    repetition_penalty: float = 1.0
    suppress_ids: tuple[int, ...] = ()
    max_new_tokens: int | None = None
    source: str | None = None

    @property
    def changes_logits(self) -> bool:
        """True when the logits need device work (a penalty or suppressed ids)."""
        return self.repetition_penalty != 1.0 or bool(self.suppress_ids)

    def describe(self) -> dict[str, Any]:
        """A JSON-able summary for the engine stats."""
        return {"repetition_penalty": self.repetition_penalty, "suppressed_ids": len(self.suppress_ids),
                "max_new_tokens": self.max_new_tokens, "eos_token_ids": list(self.eos_token_ids),
                "source": self.source}


def _ids(value: Any, field: str, path: Path) -> tuple[int, ...]:
    if value is None:
        return ()
    items = value if isinstance(value, list) else [value]
    if not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in items):
        raise GenerationConfigError(f"{path}: {field} must be token ids (non-negative integers), not {value!r}")
    return tuple(items)


def parse_generation_config(data: dict[str, Any], path: Path, default_eos: tuple[int, ...]) -> GreedyRules:
    """:class:`GreedyRules` from the parsed JSON ``data`` of ``path``.

    Raises:
        GenerationConfigError: an unknown field, a field that changes greedy output at a value we do not
            implement (``no_repeat_ngram_size`` > 0, ``num_beams`` > 1, ``min_new_tokens`` > 0, a multi-token
            ``bad_words_ids`` entry, ...), or an invalid value.
    """
    refused = []
    for key, value in data.items():
        if key in APPLIED or key in NO_EFFECT:
            continue
        if key in NEUTRAL:
            if value not in NEUTRAL[key]:
                refused.append(f"{key}={value!r}")
            continue
        refused.append(f"{key}={value!r} (unknown field)")
    if refused:
        raise GenerationConfigError(
            f"{path}: the engine does not implement {', '.join(refused)}; each changes (an unknown field may "
            f"change) the official code's greedy output, so the checkpoint would not decode as intended here "
            f"(remove the field to decode without it)")
    eos = _ids(data.get("eos_token_id"), "eos_token_id", path) or default_eos
    penalty = data.get("repetition_penalty")
    penalty = 1.0 if penalty is None else penalty
    if isinstance(penalty, bool) or not isinstance(penalty, (int, float)) or not penalty > 0:
        raise GenerationConfigError(f"{path}: repetition_penalty must be a positive number, not {penalty!r}")
    suppress = list(_ids(data.get("suppress_tokens"), "suppress_tokens", path))
    for words in data.get("bad_words_ids") or []:
        if not isinstance(words, list) or len(words) != 1:
            raise GenerationConfigError(f"{path}: bad_words_ids entry {words!r}: only single-token entries are "
                                        f"implemented (a banned sequence needs n-gram state)")
        suppress.extend(_ids(words, "bad_words_ids", path))
    budget = data.get("max_new_tokens")
    if budget is not None and (isinstance(budget, bool) or not isinstance(budget, int) or budget < 1):
        raise GenerationConfigError(f"{path}: max_new_tokens must be a positive integer, not {budget!r}")
    return GreedyRules(eos_token_ids=eos, repetition_penalty=float(penalty),
                       suppress_ids=tuple(sorted(set(suppress))), max_new_tokens=budget, source=str(path))


def read_generation_config(model_dir: str | Path | None, default_eos: tuple[int, ...]) -> GreedyRules:
    """The rules of ``model_dir/generation_config.json``; without the file (or without a folder), only
    ``default_eos`` (no penalty, no suppressed ids, no stated budget).

    Raises:
        GenerationConfigError: see :func:`parse_generation_config`; also a file that is not a JSON object.
    """
    path = Path(model_dir) / "generation_config.json" if model_dir is not None else None
    if path is None or not path.is_file():
        return GreedyRules(eos_token_ids=default_eos)
    try:
        data = json.loads(path.read_text())
    except ValueError as e:
        raise GenerationConfigError(f"{path}: not valid JSON: {e}") from None
    if not isinstance(data, dict):
        raise GenerationConfigError(f"{path}: expected a JSON object")
    return parse_generation_config(data, path, default_eos)
