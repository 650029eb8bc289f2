"""The checkpoint's greedy logits rules on the device: repetition penalty and suppressed ids.

Runs inside the model's forward, so eager steps, decode CUDA graphs and prefill CUDA graphs all apply it,
and async decode (tokens never leave the device) sees the same logits. It is graph safe: fixed shapes, no
host synchronisation, and the per-sequence history is a device table written inside the same graph.

Semantics (Hugging Face ``RepetitionPenaltyLogitsProcessor`` as ``generate`` builds it for a decoder-only
model without padding): a token counts as seen once it is anywhere in the sequence so far, prompt
included (MOSS-TD's ``<|audio_pad|>`` and marker digits too); the logit of a seen token is divided by the
penalty when positive and multiplied by it when negative. Suppressed ids get ``-inf``
(``SuppressTokensLogitsProcessor``).

History: ``seen`` bool ``[rows, vocab]``, one row per ``req_to_token`` row. Each forward marks the tokens it
feeds (``seen[token_rows, input_ids] = True``) before the penalty: a prompt chunk marks its prompt tokens,
a decode step marks the token sampled by the step before it, which is exactly the set HF's ``input_ids``
holds when that step's logits are processed. A row is cleared when a sequence is admitted to it
(:meth:`reset`). Padded graph tokens use row 0, the dummy row no sequence owns.
"""

from __future__ import annotations

import torch

from engine.attention.base import ForwardBatch
from engine.generation_config import GreedyRules


class GreedyLogitsRules:
    """Device state and the logits transform for one engine's model.

    Args:
        rules: the checkpoint's rules (:func:`engine.generation_config.read_generation_config`).
        rows: ``req_to_token`` rows (``max_running_requests + 1``: row 0 is the dummy).
        vocab: logits width.
        device: the engine's device.

    Raises:
        ValueError: a suppressed id outside the vocabulary.
    """

    def __init__(self, rules: GreedyRules, rows: int, vocab: int, device: torch.device | str) -> None:
        bad = [i for i in rules.suppress_ids if i >= vocab]
        if bad:
            raise ValueError(f"suppressed token ids {bad[:5]} are outside the vocabulary of {vocab}")
        self.penalty = float(rules.repetition_penalty)
        self.seen = (torch.zeros(rows, vocab, dtype=torch.bool, device=device) if self.penalty != 1.0 else None)
        # the value written into ``seen``, a device tensor: a Python scalar there would become a host tensor
        # copied to the device, which a graph being captured cannot do
        self._true = torch.ones((), dtype=torch.bool, device=device)
        self.suppress = (torch.tensor(rules.suppress_ids, dtype=torch.int64, device=device)
                         if rules.suppress_ids else None)

    def reset(self, rows: list[int]) -> None:
        """Forget the history of ``rows`` (sequences just admitted to them)."""
        if self.seen is not None and rows:
            idx = torch.tensor(rows, dtype=torch.int64).to(self.seen.device, non_blocking=True)
            self.seen.index_fill_(0, idx, False)

    def __call__(self, batch: ForwardBatch, logits: torch.Tensor) -> torch.Tensor:
        """float32 logits ``[B, vocab]`` at ``batch.logits_indices`` -> the processed logits (new tensor).

        Raises:
            ValueError: a penalty is set but the batch carries no ``token_rows``.
        """
        if self.seen is not None:
            if batch.token_rows is None:
                raise ValueError("the repetition penalty needs ForwardBatch.token_rows")
            self.seen.index_put_((batch.token_rows, batch.input_ids), self._true)
            seen = self.seen[batch.token_rows[batch.logits_indices]]
            penalized = torch.where(logits < 0, logits * self.penalty, logits / self.penalty)
            logits = torch.where(seen, penalized, logits)
        if self.suppress is not None:
            logits = logits.index_fill(1, self.suppress, float("-inf"))
        return logits


def install_logits_rules(model: torch.nn.Module, rules: GreedyRules | None, rows: int,
                         device: torch.device) -> None:
    """Give ``model`` the checkpoint's greedy ``rules`` (``LoadedModel.info["greedy_rules"]``) when they
    change logits and the model has the ``logits_rules`` hook; ``rows`` as :class:`GreedyLogitsRules`.
    Call it before graph capture, so the graphs contain the rules."""
    if rules is None or not rules.changes_logits or not hasattr(model, "logits_rules"):
        return
    model.logits_rules = GreedyLogitsRules(rules, rows, model.lm_head.weight.shape[0], device)
