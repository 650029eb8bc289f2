"""The one step loop (``engine.step_loop``): a failed step ends its sequences (and those of the step in
flight) in both loops and on every path, the engine serves the next request unchanged, and the counters
count the same in both loops."""

from __future__ import annotations

import pytest

from engine import Engine, FinishReason, Sequence
from engine.overlap import PLACEHOLDER
from tests.engine.test_async_decode import _engine, _requests


def _identity(seq, logits):  # a logits processor: the sequence is sampled on the host
    return logits


def _prompt(i: int) -> list[int]:
    return [(31 * i + 7 * j) % 500 + 1 for j in range(20)]


@pytest.mark.parametrize("async_decode, host", [(False, False), (True, False), (True, True)],
                         ids=["sync", "async", "async-host-sampled"])
def test_a_failed_step_ends_its_sequences_and_the_engine_goes_on(monkeypatch, async_decode, host):
    """Three sequences decode; then one forward raises. In the async loop the failing step is either the
    next launch (a step in flight: its sequences end too) or, with a host-sampled sequence, the
    synchronous step run after the in-flight one completes. Every sequence ends ``error`` with the cause,
    exactly one ``finished`` each, no placeholder left, every KV slot and row back; a later request gives
    the tokens of a fresh engine."""
    eng = _engine(async_decode)
    slots, rows = eng.allocator.num_free, eng.table.num_free
    seqs = [Sequence(prompt_ids=_prompt(i), max_new_tokens=20, ignore_eos=True) for i in range(3)]
    if host:
        seqs[1].logits_processor = _identity
    finished: list[Sequence] = []
    for s in seqs:
        s.on_event = lambda seq, kind, _: finished.append(seq) if kind == "finished" else None
        eng.submit(s)
    while min(len(s.output_ids) for s in seqs) < 3:
        eng.step()
    if async_decode and not host:
        assert eng.loop.pending is not None  # the failure hits a launch with a step in flight

    def boom(*_args, **_kw):
        raise RuntimeError("device lost")

    monkeypatch.setattr(eng.runner, "forward" if host or not async_decode else "forward_greedy", boom)
    assert eng.step()
    monkeypatch.undo()
    assert all(s.finish_reason == FinishReason.ERROR and s.error == "RuntimeError: device lost" for s in seqs)
    assert sorted(s.id for s in finished) == sorted(s.id for s in seqs)  # one "finished" each
    assert all(PLACEHOLDER not in s.output_ids for s in seqs)
    assert eng.counters["errors"] == 1 and eng.loop.pending is None
    assert eng.allocator.num_free == slots and eng.table.num_free == rows
    again = eng.generate([Sequence(prompt_ids=_prompt(9), max_new_tokens=12, ignore_eos=True)])[0]
    ref = _engine(False).generate([Sequence(prompt_ids=_prompt(9), max_new_tokens=12, ignore_eos=True)])[0]
    assert again.finish_reason == FinishReason.LENGTH and again.output_ids == ref.output_ids


def test_both_loops_count_the_same_tokens():
    """Prompts of up to 89 tokens in chunks of 64 (some prompts take two steps): both loops count every
    prompt token computed and every token appended, and one ``finished`` per sequence."""
    sync, lookahead = _engine(False), _engine(True)
    a, b = _requests(3), _requests(3)
    sync.generate(a)
    lookahead.generate(b)
    assert any(s.prompt_len > 64 for s in a)
    for eng, seqs in ((sync, a), (lookahead, b)):
        c = eng.counters
        assert c["prefill_tokens"] == sum(s.prompt_len for s in seqs)
        assert c["decode_tokens"] == sum(len(s.output_ids) for s in seqs)
        assert c["finished"] == len(seqs) and c["errors"] == 0
        assert c["steps"] >= max(len(s.output_ids) for s in seqs)


def test_host_sampled_steps_inside_the_async_loop_give_the_sync_tokens():
    """Sequences with a logits processor arrive while greedy ones decode with a step in flight: the async
    loop completes the in-flight step first and runs those steps synchronously; every sequence gives the
    tokens of the synchronous loop."""
    outs = []
    for async_decode in (False, True):
        eng: Engine = _engine(async_decode)
        greedy = [Sequence(prompt_ids=_prompt(i), max_new_tokens=15, ignore_eos=True) for i in range(3)]
        for s in greedy:
            eng.submit(s)
        for _ in range(4):
            eng.step()
        hosted = [Sequence(prompt_ids=_prompt(i + 5), max_new_tokens=6, ignore_eos=True,
                           logits_processor=_identity) for i in range(2)]
        eng.generate(hosted)
        eng.run_until_done(greedy)
        outs.append([s.output_ids for s in greedy + hosted])
        assert eng.allocator.num_free == eng.allocator.num_slots
    assert outs[0] == outs[1]
    assert all(len(o) == n for o, n in zip(outs[0], [15, 15, 15, 6, 6], strict=True))

