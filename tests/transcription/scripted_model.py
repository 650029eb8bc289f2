"""A dummy decoder whose output is scripted (one-hot logits), for tests of what the pipeline does with a
given token stream: streaming, loop guards, parsing."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

EOS = 151645
"""``<|im_end|>`` of the Qwen3 tokenizer MOSS-TD uses: the end of a scripted transcript."""


class ScriptedModel(nn.Module):
    """Emits ``script`` after the prompt, then repeats ``loop`` forever (``[EOS]``: ends after the script).

    ``prompt_len`` is the prompt's length in tokens; output position ``k`` (0 = the first generated token)
    gets logit 1 on its token and -1e4 on every other of ``vocab``. It keeps no KV cache of its own, and its
    ``prepare`` drops a sequence's audio (nothing encodes it)."""

    def __init__(self, prompt_len: int, script: list[int], loop: Sequence[int] = (EOS,),
                 vocab: int = 151_936) -> None:
        super().__init__()
        self.dummy = nn.Parameter(torch.zeros(1))
        self.prompt_len, self.script, self.loop, self.vocab = prompt_len, script, list(loop), vocab

    def forward(self, batch, attn):
        out = torch.full((batch.batch_size, self.vocab), -1e4)
        for i, pos in enumerate(batch.positions[batch.logits_indices].tolist()):
            k = pos + 1 - self.prompt_len
            n = len(self.script)
            tok = self.script[k] if k < n else self.loop[(k - n) % len(self.loop)]
            out[i, tok] = 1.0
        return out

    def kv_layout(self):
        return 1, 1, 8

    def cross_layout(self):
        return None

    max_context = 4096

    def prepare(self, seqs, cross):
        for s in seqs:
            s.mm_inputs.pop("audio", None)
