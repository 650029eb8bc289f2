"""The engine's greedy logits rules (repetition penalty, suppressed ids) against transformers' processors,
and the parsing of ``generation_config.json`` (what is applied, ignored as greedy does, or refused)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from engine.attention.base import ForwardBatch
from engine.generation_config import GenerationConfigError, GreedyRules, parse_generation_config
from engine.logits_rules import GreedyLogitsRules

transformers = pytest.importorskip("transformers")
VOCAB = 50
P = Path("generation_config.json")


def _batch(items: list[tuple[int, list[int]]]) -> ForwardBatch:
    """A step: (row, new tokens) per item; logits at each item's last token."""
    ids = [t for _, toks in items for t in toks]
    rows = [r for r, toks in items for _ in toks]
    ends = torch.cumsum(torch.tensor([len(t) for _, t in items]), 0) - 1
    n = len(items)
    z = torch.zeros(n, dtype=torch.int64)
    return ForwardBatch(input_ids=torch.tensor(ids), positions=torch.zeros(len(ids), dtype=torch.int64),
                        out_cache_loc=torch.zeros(len(ids), dtype=torch.int64), req_rows=torch.tensor(
                            [r for r, _ in items]), prefix_lens=z, extend_lens=z, seq_lens=z,
                        qo_indptr=torch.zeros(n + 1, dtype=torch.int64), logits_indices=ends,
                        token_rows=torch.tensor(rows))


@pytest.mark.parametrize("penalty", [1.05, 1.3, 0.8])
def test_penalty_and_suppression_equal_transformers_over_chunks_rows_and_reuse(penalty):
    g = torch.Generator().manual_seed(0)
    rules = GreedyLogitsRules(GreedyRules(eos_token_ids=(0,), repetition_penalty=penalty, suppress_ids=(3, 7)),
                              rows=4, vocab=VOCAB, device="cpu")
    hf_pen = transformers.RepetitionPenaltyLogitsProcessor(penalty)
    hf_sup = transformers.SuppressTokensLogitsProcessor([3, 7], device="cpu")
    history = {1: [], 2: []}
    prompts = {1: torch.randint(0, VOCAB, (23,), generator=g).tolist(),
               2: torch.randint(0, VOCAB, (9,), generator=g).tolist()}
    rules.reset([1, 2])
    # row 1's prompt in three chunks, row 2's in one, then decodes of both in one step each
    steps = [[(1, prompts[1][:10])], [(1, prompts[1][10:20]), (2, prompts[2])], [(1, prompts[1][20:])]]
    steps += [[(1, [int(torch.randint(0, VOCAB, (1,), generator=g))]),
               (2, [int(torch.randint(0, VOCAB, (1,), generator=g))])] for _ in range(6)]
    checked = 0
    for step in steps:
        for row, toks in step:
            history[row] += toks
        logits = torch.randn(len(step), VOCAB, generator=g) * 3
        ours = rules(_batch(step), logits.clone())
        for i, (row, _) in enumerate(step):
            if row == 1 and len(history[1]) < len(prompts[1]):
                continue  # mid-prompt chunk: its logits are not sampled
            ids = torch.tensor([history[row]])
            want = hf_sup(ids, hf_pen(ids, logits[i : i + 1].clone()))
            torch.testing.assert_close(ours[i : i + 1], want, rtol=0, atol=0)
            checked += 1
    assert checked == 14  # row 2 after its prompt, row 1 after its last chunk, 6 decode steps of both
    rules.reset([1])  # a new owner of row 1: nothing of the old history
    fresh = rules(_batch([(1, [5])]), torch.ones(1, VOCAB))
    assert fresh[0, 5] == torch.tensor(1.0) / penalty and (fresh[0, [0, 1, 2, 4]] == 1).all()


def test_penalty_one_changes_nothing_and_needs_no_history():
    rules = GreedyLogitsRules(GreedyRules(eos_token_ids=(0,)), rows=2, vocab=VOCAB, device="cpu")
    assert rules.seen is None and rules.suppress is None
    logits = torch.randn(1, VOCAB)
    assert torch.equal(rules(_batch([(1, [4, 5])]), logits), logits)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        GreedyLogitsRules(GreedyRules(eos_token_ids=(0,), suppress_ids=(VOCAB,)), rows=2, vocab=VOCAB, device="cpu")


def test_generation_config_fields():
    r = parse_generation_config({"eos_token_id": [1, 2], "repetition_penalty": 1.05, "suppress_tokens": [9],
                                 "bad_words_ids": [[4], [9]], "max_new_tokens": 5120, "do_sample": True,
                                 "temperature": 0.8, "top_k": 50, "num_beams": 1, "no_repeat_ngram_size": 0,
                                 "_from_model_config": True}, P, (151645,))
    assert r == GreedyRules(eos_token_ids=(1, 2), repetition_penalty=1.05, suppress_ids=(4, 9), max_new_tokens=5120,
                            source=str(P))
    assert r.changes_logits
    plain = parse_generation_config({"eos_token_id": 7, "max_length": 4096}, P, (151645,))
    assert plain == GreedyRules(eos_token_ids=(7,), source=str(P)) and not plain.changes_logits  # max_length: no effect
    assert parse_generation_config({}, P, (151645,)).eos_token_ids == (151645,)
    with pytest.raises(GenerationConfigError, match="encoder_repetition_penalty=1.2, forced_eos_token_id=5"):
        parse_generation_config({"encoder_repetition_penalty": 1.2, "forced_eos_token_id": 5}, P, (1,))
    with pytest.raises(GenerationConfigError, match="max_new_tokens must be a positive integer"):
        parse_generation_config({"max_new_tokens": 0}, P, (1,))
    with pytest.raises(GenerationConfigError, match="suppress_tokens must be token ids"):
        parse_generation_config({"suppress_tokens": ["a"]}, P, (1,))


def _cuda_engine(folder: Path, graph_bs: int, async_decode: bool):
    from engine import Engine, EngineConfig
    from tests.conftest import TINY_MOSS

    return Engine(EngineConfig(model="moss-td", load_format="dummy", model_path=str(folder), dummy_config=TINY_MOSS,
                               device="cuda", dtype="float32", attention_backend="triton", cuda_graph_max_bs=graph_bs,
                               async_decode=async_decode, kv_budget_bytes=256 << 20, max_running_requests=40,
                               chunk_size=512, seed=3))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_rules_inside_decode_and_prefill_graphs_equal_eager(tmp_path):
    """The penalty's history is written inside the graphs: teacher-forced logits through decode and prefill
    graphs equal the eager ones, and free-running async decode (tokens never on the host) gives the eager
    synchronous tokens."""
    import json

    from engine import Sequence
    from tests.conftest import teacher_forcing

    (tmp_path / "generation_config.json").write_text(json.dumps(
        {"repetition_penalty": 1.3, "suppress_tokens": [15, 16, 17], "eos_token_id": 151645}))
    graph, eager = _cuda_engine(tmp_path, 48, False), _cuda_engine(tmp_path, 0, False)
    assert graph.runner.graphs is not None and graph.model.logits_rules is not None
    gen = torch.Generator()
    logs = {}
    for name, eng in (("graph", graph), ("eager", eager)):
        logs[name] = {}
        gen.manual_seed(0)
        seqs = [Sequence(prompt_ids=torch.randint(0, 150_000, (int(torch.randint(1, 900, (1,), generator=gen)),),
                                                  generator=gen).tolist(),
                         max_new_tokens=12 + i % 9, ignore_eos=True, logits_processor=teacher_forcing(logs[name], 16),
                         tag=i) for i in range(19)]
        eng.generate(seqs)
    assert graph.runner.graphs.replays > 0 and graph.runner.prefill_graphs.replays > 0
    for tag, steps in logs["eager"].items():
        for a, b in zip(logs["graph"][tag], steps, strict=True):
            assert torch.allclose(a, b, rtol=1e-3, atol=1e-3), float((a - b).abs().max())
    fast, ref = _cuda_engine(tmp_path, 48, True), _cuda_engine(tmp_path, 0, False)
    outs = []
    for eng in (fast, ref):
        gen.manual_seed(1)
        seqs = [Sequence(prompt_ids=torch.randint(0, 150_000, (300 + 37 * i,), generator=gen).tolist(),
                         max_new_tokens=40, ignore_eos=True) for i in range(8)]
        eng.generate(seqs)
        outs.append([s.output_ids for s in seqs])
    assert outs[0] == outs[1]
    assert not any(t in (15, 16, 17) for o in outs[0] for t in o)
