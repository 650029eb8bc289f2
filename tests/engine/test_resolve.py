"""One place resolves the engine configuration: device checks, dtype from the checkpoint, per-engine
kernel choices, and graph-capture failures that fall back loudly."""

from __future__ import annotations

import logging

import pytest
import torch

from engine import DeviceUnavailable, Engine, EngineConfig
from engine.ops.linear import REFERENCE, LinearKernels, UsesLinearKernels, set_linear_kernels
from engine.resolve import check_device, checkpoint_dtype, describe, resolve_config
from tests.engine.test_engine_scheduling import TINY, tiny_engine


def test_cpu_defaults_are_the_reference_path():
    cfg = resolve_config(EngineConfig(model="whisper", load_format="dummy"))
    assert (cfg.dtype, cfg.attention_backend, cfg.async_decode) == ("float32", "torch", False)
    assert cfg.cuda_graph_max_bs == 0 and not cfg.small_batch_gemv and not cfg.fused_gelu_gemm
    assert cfg.fused_decode_gemv is False
    assert not cfg.encoder_stream and not cfg.priority_stream


def test_explicit_choices_are_kept_and_checked():
    cfg = resolve_config(EngineConfig(load_format="dummy", dtype="bfloat16", async_decode=True))
    assert cfg.dtype == "bfloat16" and cfg.async_decode is True
    with pytest.raises(ValueError, match="unknown dtype 'float8'"):
        resolve_config(EngineConfig(load_format="dummy", dtype="float8"))
    with pytest.raises(ValueError, match="unknown attention backend 'flash'"):
        resolve_config(EngineConfig(load_format="dummy", attention_backend="flash"))


@pytest.mark.parametrize("name", ["tpu", "npu:0", "not a device", "mps"])
def test_devices_the_engine_does_not_run_on_are_named(name):
    with pytest.raises(DeviceUnavailable, match=repr(name)) as e:
        check_device(name)
    assert e.value.code == "device_unavailable"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA message")
@pytest.mark.parametrize("name", ["cuda", "cuda:1"])
def test_cuda_without_cuda_is_a_clear_error(name):
    with pytest.raises(DeviceUnavailable, match=f"device '{name}': CUDA is not available"):
        Engine(EngineConfig(model="whisper", load_format="dummy", dummy_config=TINY, device=name))


def test_checkpoint_dtype_from_headers(tmp_path):
    from tests.conftest import whisper_dir

    try:
        bundled = whisper_dir()
    except Exception as e:  # noqa: BLE001 - the tiny.en package is a dependency; say why if absent
        pytest.skip(f"no tiny.en weights: {e}")
    assert checkpoint_dtype(EngineConfig(model="whisper", model_path=bundled)) == "float16"  # CT2 fp16 export
    (tmp_path / "config.json").write_text('{"text_config": {"torch_dtype": "bfloat16"}}')
    assert checkpoint_dtype(EngineConfig(model="moss-td", model_path=str(tmp_path))) == "bfloat16"
    (tmp_path / "config.json").write_text('{"dtype": "float16"}')
    assert checkpoint_dtype(EngineConfig(model="moss-td", model_path=str(tmp_path))) == "float16"
    (tmp_path / "config.json").write_text("not json")
    assert checkpoint_dtype(EngineConfig(model="moss-td", model_path=str(tmp_path))) is None
    assert checkpoint_dtype(EngineConfig(model="moss-td", load_format="dummy")) is None


def test_kernel_choices_belong_to_each_engine():
    """Two engines in one process: choosing kernels for one leaves the other's modules alone."""
    a = tiny_engine()
    b = tiny_engine()
    fast = LinearKernels(gemv_max_rows=1, fused_gelu_gemm=True)
    set_linear_kernels(a.model, fast)
    users_a = [m for m in a.model.modules() if isinstance(m, UsesLinearKernels)]
    users_b = [m for m in b.model.modules() if isinstance(m, UsesLinearKernels)]
    assert users_a and all(m.linear_kernels == fast for m in users_a)
    assert users_b and all(m.linear_kernels == REFERENCE for m in users_b)


def test_a_failed_graph_capture_falls_back_loudly(monkeypatch, caplog):
    eng = tiny_engine()

    def boom(_max_bs):
        raise RuntimeError("capture refused")

    monkeypatch.setattr(eng.runner, "capture_cuda_graphs", boom)
    with caplog.at_level(logging.ERROR, logger="diarist.engine"):
        eng.runner.capture_graphs(4, (64,), 2, eng.model.hidden_size, eng.dtype)
    assert eng.runner.graphs is None
    assert eng.stats()["fallbacks"] == ["decode CUDA graphs: RuntimeError: capture refused"]
    assert "decode CUDA graphs could not be set up" in caplog.text


def test_stats_report_the_resolved_configuration():
    st = tiny_engine().stats()
    assert st["config"] == describe(resolve_config(EngineConfig(model="whisper", load_format="dummy",
                                                                dummy_config=TINY, max_running_requests=16)))
    assert st["config"]["dtype"] == "float32" and st["fallbacks"] == []


@pytest.mark.parametrize("command", ["engine", "transcribe"])
def test_fp8_kv_on_a_gpu_without_e4m3_is_one_line_and_status_2(capsys, monkeypatch, command):
    """``--kv-dtype fp8_e4m3`` on a GPU below compute capability 8.9 (an A100 here, faked on the CPU) is
    ``kv_dtype_unsupported`` on one line with exit status 2, from the configuration check before any weight
    loads or any port opens: it was a bare ValueError, a traceback from ``diarist engine`` and ``bad_model``
    from ``transcribe``."""
    import uvicorn

    import engine.resolve
    from cli.main import main
    from engine.resolve import KVDtypeUnsupported
    from tests.conftest import data_file

    def started(*_a, **_k):
        raise AssertionError("the engine server started on a GPU that cannot store FP8 KV")

    root = logging.getLogger()  # `diarist engine` configures logging on the capture stream: restore it after
    monkeypatch.setattr(root, "handlers", list(root.handlers))
    monkeypatch.setattr(root, "level", root.level)

    monkeypatch.setattr(engine.resolve, "check_device", lambda name: torch.device("cuda:0"))
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda dev=None: (8, 0))
    monkeypatch.setattr(uvicorn, "run", started)
    with pytest.raises(KVDtypeUnsupported) as e:
        engine.resolve.check_kv_dtype("fp8_e4m3", torch.device("cuda:0"))
    assert isinstance(e.value, DeviceUnavailable) and e.value.code == "kv_dtype_unsupported"
    engine.resolve.check_kv_dtype("auto", torch.device("cuda:0"))  # the compute dtype runs anywhere
    argv = {"engine": ["engine", "--port", "0"],
            "transcribe": ["transcribe", str(data_file("en_short_yes/yes_1000ms.wav"))]}[command]
    status = main([*argv, "--device", "cuda:0", "--kv-dtype", "fp8_e4m3"])
    out, err = capsys.readouterr()
    assert status == 2 and out == "", err
    assert err == ("diarist: error: kv_dtype_unsupported: kv_dtype fp8_e4m3 needs compute capability 8.9 or "
                   "newer; cuda:0 has 8.0\n")
