"""Every file of a MOSS-TD checkpoint folder is honoured, and a missing one is said out loud (issue 18).

Checkpoints here are the tiny transformers-built reference of ``moss_reference.py`` written as a released
folder would be; which files are read, and what happens without them, is the checklist in docs/moss_td.md.
"""

from __future__ import annotations

import json
import logging

import pytest

from diarist.transcript import Transcript
from engine import Engine, EngineConfig
from engine.loaders import CheckpointError
from engine.models.moss_td_prompt import audio_span_ids, build_prompt
from tests.engine.models.moss_reference import Reference, make_audio
from transcription.moss_td.pipeline import transcribe_moss
from transcription.moss_td.sequence import build_moss_sequence

pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def reference():
    return Reference(seed=0)


@pytest.fixture(scope="module")
def bare(reference, tmp_path_factory):
    """A folder with config, weights and tokenizer only (no processor, generation or template files)."""
    return reference.write_checkpoint(tmp_path_factory.mktemp("bare") / "ckpt", shards=1)


def engine_for(path, **kw) -> Engine:
    return Engine(EngineConfig(**{"model": "moss-td", "model_path": str(path), "load_format": "hf",
                                  "kv_budget_bytes": 32 << 20, "max_running_requests": 4, **kw}))


class Opts:
    max_new_tokens = 4
    prompt = None


# -- item 1: the time-marker interval ---------------------------------------------------------------------
def test_missing_processor_config_warns_and_every_record_states_the_interval(bare, caplog):
    with caplog.at_level(logging.WARNING, logger="diarist.engine"):
        eng = engine_for(bare)
    warned = [r.getMessage() for r in caplog.records if "time_marker_every_seconds" in r.getMessage()]
    assert len(warned) == 1 and "every 2 s (the processor code's default)" in warned[0]
    assert "DIARIST_MOSS_MARKER_INTERVAL_S" in warned[0]
    st = eng.stats()
    assert st["marker_interval_s"] == 2 and st["marker_interval_source"] == "default"
    res = transcribe_moss(eng, make_audio(6, 1), Opts(), None)
    assert res["marker_interval_s"] == 2
    assert Transcript.from_engine_json({**res, "model": "m"}).marker_interval_s == 2.0


def test_an_assumed_marker_interval_is_a_warning_of_every_result(bare, reference, tmp_path):
    """Not only a load-log line: the result's warnings say the interval was assumed, and which (item 3)."""
    from transcription.audio import DecodedAudio
    from transcription.transcriber import TranscribeOptions, Transcriber

    opts = TranscribeOptions(max_new_tokens=4)
    audio = DecodedAudio(make_audio(6, 1)[None], 16_000, 1, "pcm_f32le", "wav")
    res = Transcriber(engine_for(bare)).transcribe(audio, opts).to_json()
    assumed = [w for w in res["warnings"] if w["code"] == "marker_interval_assumed"]
    assert len(assumed) == 1 and "every 2 s" in assumed[0]["message"]
    assert "processor_config.json" in assumed[0]["message"]
    t = Transcript.from_engine_json(res)
    assert any(w.code == "marker_interval_assumed" for w in t.warnings)
    five = reference.write_checkpoint(tmp_path / "five", shards=1, marker_every_s=5)
    stated = Transcriber(engine_for(five)).transcribe(audio, opts).to_json()
    assert not [w for w in stated["warnings"] if w["code"] == "marker_interval_assumed"]


def test_setting_sets_the_interval_and_wins_over_the_folder(reference, tmp_path, caplog):
    five = reference.write_checkpoint(tmp_path / "five", shards=1, marker_every_s=5)
    eng = engine_for(five)
    assert eng.stats()["marker_interval_source"] == "processor_config.json"
    assert eng.stats()["marker_interval_s"] == 5
    with caplog.at_level(logging.WARNING, logger="diarist.engine"):
        three = engine_for(five, marker_interval_s=3)
    assert any("although processor_config.json" in r.getMessage() for r in caplog.records)
    assert three.stats()["marker_interval_s"] == 3 and three.stats()["marker_interval_source"] == "setting"
    wave = make_audio(30, 1)
    seq = build_moss_sequence(three, wave, max_new_tokens=4)
    assert seq.prompt_ids == build_prompt(three.tokenizer, wave.size, None, 3).ids
    assert seq.prompt_ids != build_prompt(three.tokenizer, wave.size, None, 5).ids
    with pytest.raises(CheckpointError, match=">= 0 seconds"):
        engine_for(five, marker_interval_s=-1)


def test_the_setting_reaches_the_engine_config(monkeypatch):
    from diarist.settings import Settings

    monkeypatch.setenv("DIARIST_MOSS_MARKER_INTERVAL_S", "5")
    assert Settings(_env_file=None).engine_config(model="moss-td").marker_interval_s == 5
    monkeypatch.delenv("DIARIST_MOSS_MARKER_INTERVAL_S")
    assert Settings(_env_file=None).engine_config(model="moss-td").marker_interval_s is None


# -- item 2: generation_config.json -------------------------------------------------------------------------
N_PENALTY = 40  # tokens compared; the 1.05 penalty changes this checkpoint's greedy output from token 7 on


@pytest.fixture(scope="module")
def penalized(reference, tmp_path_factory):
    """The released folder's generation config shape: sampling fields (the official path forces greedy),
    the 5120-token budget, EOS, and a repetition penalty of 1.05."""
    path = reference.write_checkpoint(tmp_path_factory.mktemp("pen") / "ckpt", shards=1, marker_every_s=5)
    (path / "generation_config.json").write_text(json.dumps({
        "do_sample": True, "temperature": 0.8, "top_p": 0.95, "top_k": 50, "max_new_tokens": 5120,
        "eos_token_id": 151645, "pad_token_id": 151643, "repetition_penalty": 1.05,
        "transformers_version": "4.57.1"}))
    return path


def _official_greedy(reference, path, prompt_ids, wave, n):
    """Hugging Face ``generate`` as OpenMOSS ``generate_transcription`` calls it: the folder's generation
    config with ``do_sample=False``; prompt ids and audio embeddings as the released model fuses them."""
    import torch
    from transformers import GenerationConfig

    from tests.engine.models.moss_reference import AUDIO_ID

    ids = torch.tensor([prompt_ids])
    with torch.inference_mode():
        emb = reference.lm.get_input_embeddings()(ids)
        emb = emb.masked_scatter((ids == AUDIO_ID)[..., None].expand_as(emb),
                                 reference.audio_embeddings(wave).to(emb.dtype))
        gc = GenerationConfig.from_pretrained(path)
        gc.do_sample, gc.max_new_tokens, gc.eos_token_id = False, n, None  # a fixed number of steps
        out = reference.lm.generate(input_ids=ids, inputs_embeds=emb, attention_mask=torch.ones_like(ids),
                                    generation_config=gc)
    return out[0, -n:].tolist()


def _fixed(engine, wave, n):
    seq = build_moss_sequence(engine, wave, max_new_tokens=n)
    seq.stop_token_ids, seq.stop_checker = (), None
    return seq


def test_repetition_penalty_equals_the_official_generate(reference, penalized):
    eng = engine_for(penalized, chunk_size=64)  # the penalty's history spans prefill chunks
    assert eng.stats()["generation"]["repetition_penalty"] == 1.05
    waves = [make_audio(30, 1), make_audio(45, 2)]
    seqs = [_fixed(eng, w, N_PENALTY) for w in waves]
    for s in seqs:  # batched, prompts chunked: each row keeps its own history
        eng.submit(s)
    eng.run_until_done(seqs)
    for seq, wave in zip(seqs, waves, strict=True):
        official = _official_greedy(reference, penalized, seq.prompt_ids, wave, N_PENALTY)
        assert seq.output_ids == official
        plain, _ = reference.greedy(seq.prompt_ids, wave, N_PENALTY)
        assert plain != official  # the penalty matters here, so the equality above has power
    again = _fixed(eng, waves[0], N_PENALTY)  # a reused row starts with no history
    eng.generate([again])
    assert again.output_ids == seqs[0].output_ids


def test_checkpoint_max_new_tokens_lowers_only_the_short_clip_floor(penalized, reference, tmp_path):
    eng = engine_for(penalized)
    assert build_moss_sequence(eng, make_audio(6, 1)).max_new_tokens == 512  # min(5120, 512) vs 60
    path = reference.write_checkpoint(tmp_path / "small", shards=1, marker_every_s=5)
    (path / "generation_config.json").write_text(json.dumps({"max_new_tokens": 100}))
    small = engine_for(path)
    assert build_moss_sequence(small, make_audio(6, 1)).max_new_tokens == 100
    assert build_moss_sequence(small, make_audio(30, 1)).max_new_tokens == 300  # 10 tokens per second
    assert build_moss_sequence(small, make_audio(6, 1), max_new_tokens=7).max_new_tokens == 7


def test_request_budget_wins_over_max_length_as_in_the_official_generate(reference, tmp_path):
    """HF ``generate`` lets ``max_new_tokens`` win over the config's ``max_length`` (issue 33 item 1)."""
    path = reference.write_checkpoint(tmp_path / "maxlen", shards=1, marker_every_s=5)
    (path / "generation_config.json").write_text(json.dumps({"max_length": 97, "eos_token_id": 151645}))
    eng = engine_for(path, kv_budget_bytes=64 << 20)
    wave = make_audio(30, 1)
    seq = _fixed(eng, wave, 48)
    assert seq.prompt_len > 97 and seq.max_new_tokens == 48
    eng.generate([seq])
    assert seq.output_ids == _official_greedy(reference, path, seq.prompt_ids, wave, 48)
    # without a request budget the default one applies (10 tokens per second), not what max_length leaves
    assert build_moss_sequence(eng, make_audio(120, 2)).max_new_tokens == 1200


def test_generation_config_with_every_default_field_loads(reference, tmp_path):
    """A config transformers wrote with every field at its default (``use_diff=False``) loads: no-op values
    are accepted; the budget and the EOS it states apply (issue 33 item 2)."""
    from transformers import GenerationConfig

    path = reference.write_checkpoint(tmp_path / "full", shards=1, marker_every_s=5)
    GenerationConfig(max_new_tokens=100, eos_token_id=151645).to_json_file(path / "generation_config.json",
                                                                           use_diff=False)
    full = json.loads((path / "generation_config.json").read_text())
    assert len(full) > 60  # every field, at its default
    eng = engine_for(path)
    assert eng.stats()["generation"]["max_new_tokens"] == 100
    assert build_moss_sequence(eng, make_audio(6, 1)).max_new_tokens == 100
    # transformers 4.x writes its neutral values, not None
    v4 = {**full, "max_length": 20, "min_length": 0, "num_beams": 1, "num_beam_groups": 1, "do_sample": False,
          "temperature": 1.0, "top_k": 50, "top_p": 1.0, "typical_p": 1.0, "repetition_penalty": 1.0,
          "encoder_repetition_penalty": 1.0, "length_penalty": 1.0, "no_repeat_ngram_size": 0,
          "encoder_no_repeat_ngram_size": 0, "renormalize_logits": False, "remove_invalid_values": False,
          "token_healing": False, "num_return_sequences": 1, "is_assistant": False, "num_assistant_tokens": 20,
          "num_assistant_tokens_schedule": "constant", "assistant_confidence_threshold": 0.4,
          "assistant_lookbehind": 10, "target_lookbehind": 10, "return_legacy_cache": True, "use_cache": True,
          "generation_kwargs": {}, "forced_decoder_ids": None, "constraints": None, "force_words_ids": None}
    (path / "generation_config.json").write_text(json.dumps(v4))
    assert build_moss_sequence(engine_for(path), make_audio(6, 1)).max_new_tokens == 100
    (path / "generation_config.json").write_text(json.dumps({**full, "force_words_ids": [[5]]}))
    with pytest.raises(CheckpointError, match=r"force_words_ids=\[\[5\]\]"):
        engine_for(path)


@pytest.mark.parametrize(("fields", "named"), [
    ({"no_repeat_ngram_size": 3}, "no_repeat_ngram_size=3"),
    ({"num_beams": 4}, "num_beams=4"),
    ({"min_new_tokens": 10}, "min_new_tokens=10"),
    ({"bad_words_ids": [[11, 12]]}, "only single-token entries"),
    ({"my_new_knob": 1}, "my_new_knob=1 (unknown field)"),
    ({"repetition_penalty": 0}, "positive number"),
])
def test_unsupported_generation_fields_are_refused_at_load(reference, tmp_path, fields, named):
    path = reference.write_checkpoint(tmp_path / "bad", shards=1, marker_every_s=5)
    (path / "generation_config.json").write_text(json.dumps({"eos_token_id": 151645, **fields}))
    with pytest.raises(CheckpointError, match="generation_config.json") as e:
        engine_for(path)
    assert named in str(e.value)


# -- item 3: the context --------------------------------------------------------------------------------------
def test_context_is_the_official_limit_whatever_the_config_says(bare):
    import numpy as np

    from engine.request import RequestRejected

    conf = json.loads((bare / "config.json").read_text())
    assert conf["text_config"]["max_position_embeddings"] == 8192  # this folder's config says less
    eng = engine_for(bare, kv_budget_bytes=16 << 20)
    assert eng.max_context == 131_072
    eleven_min = np.zeros(11 * 60 * 16_000, dtype=np.float32)
    assert len(build_moss_sequence(eng, eleven_min, max_new_tokens=8).prompt_ids) > 8192  # accepted
    with pytest.raises(RequestRejected) as e:
        build_moss_sequence(eng, np.zeros(160 * 60 * 16_000, dtype=np.float32))  # pages never touched
    msg = e.value.message
    assert e.value.code == "too_long" and "prompt of 138734 tokens" in msg and "131072-token context" in msg
    assert "official processor's limit" in msg
    short = engine_for(bare, kv_budget_bytes=2 << 20, max_context=4096)
    with pytest.raises(RequestRejected, match="4096-token context .this engine's max_context; the model allows "
                                              "131072"):
        build_moss_sequence(short, eleven_min)


# -- item 5: the chat template --------------------------------------------------------------------------------
# A Qwen-style template (default system turn, content parts) that renders the released format.
QWEN_STYLE = (
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}"
    "{{ '<|im_start|>system\\n' + (system_prompt | default('You are a helpful assistant.')) + '<|im_end|>\\n' }}"
    "{% endif %}{{ '<|im_start|>' + message['role'] + '\\n' }}{% for part in message['content'] %}"
    "{% if part['type'] == 'audio' %}{{ '<|audio_start|><|audio_pad|><|audio_end|>\\n' }}"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}{% endfor %}{{ '<|im_end|>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def _hf_render(template: str, instruction: str) -> str:
    from transformers.utils.chat_template_utils import render_jinja_template

    messages = [{"role": "user", "content": [{"type": "audio", "audio": "a.wav"}, {"type": "text", "text": instruction}]}]
    out = render_jinja_template(conversations=[messages], chat_template=template, add_generation_prompt=True)
    return out[0][0] if isinstance(out, tuple) else out[0]


@pytest.mark.parametrize("where", ["chat_template.jinja", "tokenizer_config.json"])
def test_chat_template_from_the_folder(reference, tmp_path, where):
    path = reference.write_checkpoint(tmp_path / "tpl", shards=1, marker_every_s=5)
    builtin = build_prompt(engine_for(path).tokenizer, 30 * 16_000, "Transcribe.", 5).ids
    template = QWEN_STYLE.replace("You are a helpful assistant.", "You transcribe meetings.")
    if where == "chat_template.jinja":
        (path / where).write_text(template)
    else:
        (path / where).write_text(json.dumps({"chat_template": template, "model_max_length": 131072}))
    eng = engine_for(path)
    assert eng.stats()["chat_template"] == where
    wave = make_audio(30, 1)
    seq = build_moss_sequence(eng, wave, prompt="Transcribe.")
    before, after = (eng.tokenizer.encode(t) for t in _hf_render(template, "Transcribe.").split("<|audio_pad|>"))
    span = audio_span_ids(seq.mm_state["num_audio_tokens"], 151671, list(range(15, 25)), 5)
    assert seq.prompt_ids == before + span + after  # the folder's template, rendered as transformers renders it
    assert seq.prompt_ids != builtin
    (path / where).unlink()
    (path / "chat_template.jinja").write_text(QWEN_STYLE)  # the released format as a template: same ids
    assert build_moss_sequence(engine_for(path), wave, prompt="Transcribe.").prompt_ids == builtin


def test_chat_template_sees_the_tokenizers_special_tokens_as_transformers_renders_it(reference, tmp_path):
    """``eos_token``, ``bos_token``, ... are template variables, as ``apply_chat_template`` passes them
    (issue 33 item 4): from tokenizer_config.json, overridden by special_tokens_map.json; unset ones undefined."""
    from transformers import PreTrainedTokenizerFast

    path = reference.write_checkpoint(tmp_path / "special", shards=1, marker_every_s=5)
    template = (QWEN_STYLE.replace("'<|im_end|>\\n'", "eos_token + '\\n'")
                .replace("{% for message in messages %}",
                         "{{ bos_token | default('') }}{% for message in messages %}[{{ pad_token }}]", 1))
    assert template.count("eos_token") == 2
    (path / "chat_template.jinja").write_text(template)
    (path / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": None, "unk_token": None,
        "eos_token": {"__type": "AddedToken", "content": "<|im_end|>", "lstrip": False, "rstrip": False, "normalized": False,
                      "single_word": False, "special": True}, "pad_token": "<|im_start|>"}))
    (path / "special_tokens_map.json").write_text(json.dumps({"pad_token": "<|endoftext|>"}))
    eng = engine_for(path)
    wave = make_audio(30, 1)
    seq = build_moss_sequence(eng, wave, prompt="Transcribe.")
    hf = PreTrainedTokenizerFast.from_pretrained(str(path))
    messages = [{"role": "user", "content": [{"type": "audio", "audio": "a.wav"},
                                             {"type": "text", "text": "Transcribe."}]}]
    rendered = hf.apply_chat_template(messages, chat_template=template, tokenize=False, add_generation_prompt=True)
    assert "<|im_end|>" in rendered and rendered.startswith("[<|endoftext|>]")
    before, after = (eng.tokenizer.encode(t) for t in rendered.split("<|audio_pad|>"))
    span = audio_span_ids(seq.mm_state["num_audio_tokens"], 151671, list(range(15, 25)), 5)
    assert seq.prompt_ids == before + span + after


def test_without_a_template_the_built_in_format_is_used(bare):
    assert engine_for(bare).stats()["chat_template"] == "built-in"


def test_a_template_without_one_audio_placeholder_is_refused(reference, tmp_path):
    path = reference.write_checkpoint(tmp_path / "tpl0", shards=1, marker_every_s=5)
    (path / "chat_template.jinja").write_text("{% for m in messages %}{{ m['role'] }}{% endfor %}")
    with pytest.raises(CheckpointError, match="renders 0 <.audio_pad.> placeholders"):
        engine_for(path)
    (path / "chat_template.jinja").write_text("{% for m in messages %}")
    with pytest.raises(CheckpointError, match="does not compile"):
        engine_for(path)


# -- item 10: the feature extractor's file is checked, not assumed ------------------------------------------
def test_preprocessor_config_must_state_our_frontend(reference, tmp_path):
    path = reference.write_checkpoint(tmp_path / "fe", shards=1, marker_every_s=5)
    whisper_fe = {"feature_extractor_type": "WhisperFeatureExtractor", "feature_size": 80, "sampling_rate": 16000,
                  "hop_length": 160, "n_fft": 400, "chunk_length": 30, "n_samples": 480000, "nb_max_frames": 3000,
                  "dither": 0.0, "padding_side": "right", "return_attention_mask": False}
    (path / "preprocessor_config.json").write_text(json.dumps(whisper_fe))
    engine_for(path)  # the released frontend: accepted
    (path / "preprocessor_config.json").write_text(json.dumps({**whisper_fe, "feature_size": 128}))
    with pytest.raises(CheckpointError, match=r"feature_size=128 \(ours 80\)"):
        engine_for(path)
