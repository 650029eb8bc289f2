"""The model and attention-backend contracts (engine.models.interface, engine.attention): every model the
loaders build satisfies EngineModel, only MOSS-TD takes the encoder stage, only Triton is graph-capable,
and the engine picks graphs and the encoder stage from those types."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from engine import EngineConfig
from engine.attention import (
    BACKENDS,
    GraphCapableBackend,
    TorchReferenceBackend,
    backend_class,
    make_backend,
    supports_cuda_graphs,
)
from engine.encoder_manager import EncoderManager
from engine.loaders import load_model
from engine.loaders.moss_td import TINY_DUMMY_CONFIG
from engine.models.interface import AudioPromptModel, EngineModel
from engine.models.qwen3 import Qwen3Config, Qwen3ForCausalLM
from engine.resolve import resolve_config
from tests.engine.test_engine_scheduling import TINY

QWEN_TINY = {"vocab_size": 256, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                 "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32, "max_position_embeddings": 512}


@pytest.fixture(scope="module")
def models():
    whisper = load_model(EngineConfig(model="whisper", load_format="dummy", dummy_config=TINY, dtype="float32"))
    moss = load_model(EngineConfig(model="moss-td", load_format="dummy", dummy_config=TINY_DUMMY_CONFIG,
                                   dtype="float32"))
    qwen = Qwen3ForCausalLM(Qwen3Config.from_dict(QWEN_TINY))
    return {"whisper": whisper.model, "moss-td": moss.model, "qwen3": qwen}


def test_every_model_satisfies_the_engine_contract(models):
    for name, model in models.items():
        assert isinstance(model, EngineModel), name
    assert models["whisper"].hidden_size == TINY["d_model"]
    assert models["moss-td"].hidden_size == TINY_DUMMY_CONFIG["text_config"]["hidden_size"] == 64
    assert models["qwen3"].hidden_size == 64
    assert models["whisper"].cross_layout() is not None
    assert models["moss-td"].cross_layout() is None and models["qwen3"].cross_layout() is None


def test_only_moss_td_takes_the_encoder_stage(models):
    assert isinstance(models["moss-td"], AudioPromptModel)
    assert not isinstance(models["whisper"], AudioPromptModel)
    assert not isinstance(models["qwen3"], AudioPromptModel)
    cpu = torch.device("cpu")
    moss_stage = EncoderManager(models["moss-td"], cpu)
    assert moss_stage.enabled and moss_stage.encoder_fn is models["moss-td"].audio_encoder
    assert moss_stage.emb_spec == (64, torch.float32)
    whisper_stage = EncoderManager(models["whisper"], cpu)
    assert not whisper_stage.enabled and whisper_stage.encoder_fn is None


def test_only_triton_is_graph_capable():
    assert BACKENDS == ("torch", "triton")
    assert not supports_cuda_graphs("torch")
    assert not issubclass(TorchReferenceBackend, GraphCapableBackend)
    assert supports_cuda_graphs("triton")  # imports the Triton backend, never runs a kernel
    with pytest.raises(ValueError, match="unknown attention backend 'flash'"):
        backend_class("flash")


def test_backends_take_their_own_tuning_from_the_config():
    cfg = dataclasses.replace(EngineConfig(), extend_large_tile_min_tokens=777,
                              decode_single_split_programs_per_sm=5)
    assert TorchReferenceBackend.config_options(cfg) == {}
    assert backend_class("triton").config_options(cfg) == {"large_tile_min_extend": 777, "single_split_per_sm": 5}
    from engine.kv import KVPool, ReqToTokenTable

    kv = KVPool(1, 16, 1, 8, torch.float32, torch.device("cpu"))
    table = ReqToTokenTable(2, 16, torch.device("cpu"))
    backend = make_backend("torch", cfg, kv=kv, table=table)
    assert type(backend) is TorchReferenceBackend and backend.kv is kv


def test_graphs_are_resolved_off_without_a_graph_capable_backend():
    # on the CPU nothing is captured, whatever was asked for
    cfg = resolve_config(EngineConfig(model="whisper", load_format="dummy", cuda_graph_max_bs=32))
    assert cfg.cuda_graph_max_bs == 0
