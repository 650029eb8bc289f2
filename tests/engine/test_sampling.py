"""Per-request sampling: greedy stays the default and the fast path, a temperature with a fixed seed draws the
tokens the pure-torch reference draws (on the CPU and on a GPU engine, sync or async loop), logprobs are the
processed logits' log-softmax, and ``run_until_any_done`` returns at the first finished sequence."""

from __future__ import annotations

import random

import pytest
import torch

from engine import Engine, EngineConfig, FinishReason, Sequence
from engine.sampling import GREEDY, SamplingParams, needs_host

CUDA = torch.cuda.is_available()
VOCAB = 512
TINY = {  # random weights with a wide spread: sampled tokens differ from greedy ones at temperature 1
    "text_config": {"num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
                    "num_key_value_heads": 2, "head_dim": 16, "vocab_size": VOCAB},
    "audio_config": {"d_model": 32, "encoder_layers": 1, "encoder_attention_heads": 2, "encoder_ffn_dim": 64},
    "init_std": 0.5,
}
DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(not CUDA, reason="needs CUDA")])]


def _engine(device: str = "cpu", async_decode: bool = False) -> Engine:
    gpu = device == "cuda"
    return Engine(EngineConfig(model="moss-td", load_format="dummy", dummy_config=TINY, device=device,
                               attention_backend="triton" if gpu else "torch", async_decode=async_decode,
                               kv_budget_bytes=16 << 20, max_running_requests=8, seed=7))


def _prompt(seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(VOCAB) for _ in range(rng.randrange(4, 40))]


class Recorder:
    """An identity logits processor that keeps a copy of every step's logits (the reference's input)."""

    def __init__(self) -> None:
        self.steps: list[torch.Tensor] = []

    def __call__(self, seq: Sequence, logits: torch.Tensor) -> torch.Tensor:
        self.steps.append(logits.clone())
        return logits


@pytest.fixture(scope="module")
def cpu_engine():
    return _engine()


def test_default_is_greedy_on_the_device_path():
    seq = Sequence(prompt_ids=[1, 2, 3], max_new_tokens=4)
    assert seq.sampling is GREEDY and seq.sampling.greedy and not needs_host(seq)
    assert needs_host(Sequence(prompt_ids=[1], max_new_tokens=1, sampling=SamplingParams(temperature=0.2)))
    assert needs_host(Sequence(prompt_ids=[1], max_new_tokens=1, sampling=SamplingParams(logprobs=True)))
    for bad in (-0.1, float("nan"), float("inf")):
        with pytest.raises(ValueError):
            SamplingParams(temperature=bad)


def test_greedy_logprobs_change_no_token_and_are_the_log_softmax(cpu_engine):
    plain = [Sequence(prompt_ids=_prompt(i), max_new_tokens=12) for i in range(4)]
    recs = [Recorder() for _ in range(4)]
    traced = [Sequence(prompt_ids=_prompt(i), max_new_tokens=12, logits_processor=recs[i],
                       sampling=SamplingParams(logprobs=True)) for i in range(4)]
    cpu_engine.generate(plain + traced)
    for p, t, rec in zip(plain, traced, recs, strict=True):
        assert t.output_ids == p.output_ids and p.output_logprobs == []
        assert len(t.output_logprobs) == len(t.output_ids) == len(rec.steps)
        for tok, lp, logits in zip(t.output_ids, t.output_logprobs, rec.steps, strict=True):
            ref = torch.log_softmax(logits, dim=-1)
            assert lp == pytest.approx(float(ref[tok]), abs=1e-6)
            assert lp == pytest.approx(float(ref.max()), abs=1e-6)  # greedy: the most probable token


def _reference_draws(steps: list[torch.Tensor], temperature: float, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return [int(torch.multinomial(torch.softmax(x / temperature, dim=-1), 1, generator=g)) for x in steps]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("async_decode", [False, True])
def test_seeded_sampling_equals_the_torch_reference(device, async_decode):
    eng = _engine(device, async_decode)
    recs = [Recorder() for _ in range(3)]
    sampled = [Sequence(prompt_ids=_prompt(10 + i), max_new_tokens=16, logits_processor=recs[i],
                        sampling=SamplingParams(temperature=1.0, seed=1234 + i), tag=i) for i in range(3)]
    greedy = [Sequence(prompt_ids=_prompt(10 + i), max_new_tokens=16) for i in range(3)]
    eng.generate(sampled + greedy)  # sampled and greedy rows share the steps
    for s, g, rec in zip(sampled, greedy, recs, strict=True):
        assert s.output_ids == _reference_draws(rec.steps, 1.0, 1234 + s.tag)
    assert any(s.output_ids != g.output_ids for s, g in zip(sampled, greedy, strict=True))
    assert eng.allocator.num_free == eng.allocator.num_slots


def test_a_fixed_seed_repeats_whatever_shares_the_batch(cpu_engine):
    def run(seed: int, company: int) -> list[int]:
        seq = Sequence(prompt_ids=_prompt(99), max_new_tokens=20,
                       sampling=SamplingParams(temperature=0.8, seed=seed))
        others = [Sequence(prompt_ids=_prompt(200 + k), max_new_tokens=5 + k,
                           sampling=SamplingParams(temperature=1.0, seed=k)) for k in range(company)]
        cpu_engine.generate([seq, *others])
        return seq.output_ids

    alone = run(5, 0)
    assert run(5, 3) == alone and run(5, 1) == alone
    assert run(6, 0) != alone


def test_a_tiny_temperature_picks_the_greedy_tokens(cpu_engine):
    greedy = Sequence(prompt_ids=_prompt(3), max_new_tokens=10)
    cold = Sequence(prompt_ids=_prompt(3), max_new_tokens=10, sampling=SamplingParams(temperature=1e-4, seed=0))
    cpu_engine.generate([greedy, cold])
    assert cold.output_ids == greedy.output_ids


def test_run_until_any_done_returns_at_the_first_finished(cpu_engine):
    short = Sequence(prompt_ids=_prompt(1), max_new_tokens=2)
    long = Sequence(prompt_ids=_prompt(2), max_new_tokens=40)
    cpu_engine.submit(short)
    cpu_engine.submit(long)
    done = cpu_engine.run_until_any_done([long, short])
    assert done == [short] and short.finish_reason == FinishReason.LENGTH
    assert not long.finished and 0 < len(long.output_ids) < 40
    assert cpu_engine.run_until_any_done([long, short]) == [short]  # already finished: at once
    cpu_engine.run_until_done([long])
    assert len(long.output_ids) == 40
    assert cpu_engine.allocator.num_free == cpu_engine.allocator.num_slots
