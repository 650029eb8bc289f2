"""Whisper encoder (engine/models/whisper.py): the fused layer (packed q/k/v, residual adds inside the
LayerNorms, contiguous residual stream) computes what the plain HF-style layer computes.

CPU, float32: the fused path is held to float32 rounding; the unfused path runs the same torch ops in the
same order as the plain computation, so it is held to bit equality (in bf16 too). On CPU the ops dispatch to
their torch references; the Triton kernels are checked in tests/engine/ops/test_fused_ops.py.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from engine.models.whisper import WhisperConfig, WhisperEncoder

CFG = WhisperConfig(d_model=64, encoder_layers=3, encoder_attention_heads=4, encoder_ffn_dim=128,
                    num_mel_bins=80, max_source_positions=1500)


def _encoder(seed: int = 0) -> WhisperEncoder:
    """Random weights with non-zero biases and norm weights away from 1, so a dropped bias, a swapped
    q/k/v slice or an ignored norm parameter changes the output."""
    enc = WhisperEncoder(CFG).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in enc.named_parameters():
            is_norm_weight = p.dim() == 1 and "layer_norm" in name and name.endswith("weight")
            scale = 0.3 if p.dim() == 1 else 1.0 / p.shape[-1] ** 0.5 * (3 if "conv" in name else 1)
            p.copy_((1.0 if is_norm_weight else 0.0) + scale * torch.randn(p.shape, generator=g))
    return enc


def _mel(batch: int, seed: int = 1) -> torch.Tensor:
    return torch.randn(batch, CFG.num_mel_bins, 3000, generator=torch.Generator().manual_seed(seed))


def plain_encoder(enc: WhisperEncoder, mel: torch.Tensor) -> torch.Tensor:
    """HF ``WhisperEncoder.forward`` written out with the module's parameters: what the engine computed
    before the fusions (separate q/k/v, ``x = x + block(ln(x))``)."""
    x = F.gelu(enc.conv2(F.gelu(enc.conv1(mel)))).transpose(1, 2) + enc.embed_positions.weight[:1500]
    for layer in enc.layers:
        a = layer.self_attn
        h = layer.self_attn_layer_norm(x)
        q, k, v = (a.split(p(h)).transpose(1, 2) for p in (a.q_proj, a.k_proj, a.v_proj))
        x = x + a.out_proj(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).flatten(2))
        x = x + layer.fc2(F.gelu(layer.fc1(layer.final_layer_norm(x))))
    return enc.layer_norm(x)


@torch.inference_mode()
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_unfused_path_equals_plain_computation_bitwise(dtype):
    enc = _encoder().to(dtype)
    mel = _mel(2).to(dtype)
    out = enc(mel)
    assert out.shape == (2, 1500, 64) and out.dtype == dtype and out.is_contiguous()
    assert torch.equal(out, plain_encoder(enc, mel))


@torch.inference_mode()
def test_fused_layer_equals_plain_computation_float32():
    enc = _encoder()
    mel = _mel(3)
    ref = plain_encoder(enc, mel)
    enc.fuse_projections()
    assert all(layer.qkv_weight is not None for layer in enc.layers)
    out = enc(mel)
    assert float(ref.abs().max()) > 1.0  # O(1) outputs: the tolerance below is tight relative to them
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    # each window on its own gives the same rows (no mixing across the batch through the packed views)
    torch.testing.assert_close(enc(mel[1:2]), ref[1:2], rtol=1e-5, atol=1e-5)
    # and in bf16 the fused encoder stays within bf16 rounding of the plain one
    enc16 = _encoder().to(torch.bfloat16)
    ref16 = plain_encoder(enc16, mel.bfloat16()).float()
    enc16.fuse_projections()
    rel = float((enc16(mel.bfloat16()).float() - ref16).norm() / ref16.norm())
    assert rel < 1e-2, rel


@torch.inference_mode()
def test_residual_stream_is_contiguous():
    """The conv output is [B, d, 1500]; a transposed stream made every LayerNorm copy and every residual
    add run strided (the 3.6 ms of copies per 8 windows on the H200)."""
    enc = _encoder()
    x = enc.embed(_mel(2))
    assert x.is_contiguous()
    enc.fuse_projections()
    out, residual = enc.layers[0](x)
    assert out.is_contiguous() and residual.is_contiguous()
    assert enc(_mel(2)).is_contiguous()


@torch.inference_mode()
def test_fused_weights_keep_names_views_and_follow_to():
    enc = _encoder()
    before = {k: v.clone() for k, v in enc.state_dict().items()}
    enc.fuse_projections()
    layer = enc.layers[1]
    a, d = layer.self_attn, CFG.d_model
    assert layer.qkv_weight.shape == (3 * d, d) and layer.qkv_bias.shape == (3 * d,)
    # HF names still address the weights, as views of the packed tensors; k has no bias, its rows are zero
    assert a.k_proj.weight.data_ptr() == layer.qkv_weight[d].data_ptr()
    assert a.v_proj.bias.data_ptr() == layer.qkv_bias[2 * d:].data_ptr()
    assert a.k_proj.bias is None and not layer.qkv_bias[d:2 * d].any()
    after = enc.state_dict()
    assert set(after) == set(before)
    for name, t in before.items():
        assert torch.equal(after[name], t), name
    # loading by name after fusing writes into the packed weight the forward uses
    new_q = torch.randn(d, d)
    enc.load_state_dict({**before, "layers.1.self_attn.q_proj.weight": new_q}, strict=True)
    assert torch.equal(layer.qkv_weight[:d], new_q)
    # Module.to converts each parameter on its own; the packed tensors are rebuilt from them
    enc.double()
    assert layer.qkv_weight.dtype == torch.float64 and layer.qkv_bias.dtype == torch.float64
    assert a.v_proj.weight.data_ptr() == layer.qkv_weight[2 * d].data_ptr()
    assert torch.equal(layer.qkv_weight[:d], new_q.double())


def test_transformers_encoder_loads_our_state_dict_and_agrees():
    """Independent check: transformers' WhisperEncoder with our (fused) encoder's state dict."""
    transformers = pytest.importorskip("transformers")
    from transformers.models.whisper.modeling_whisper import WhisperEncoder as HFEncoder

    enc = _encoder()
    enc.fuse_projections()
    hf = HFEncoder(transformers.WhisperConfig(
        d_model=CFG.d_model, encoder_layers=CFG.encoder_layers,
        encoder_attention_heads=CFG.encoder_attention_heads, encoder_ffn_dim=CFG.encoder_ffn_dim,
        num_mel_bins=CFG.num_mel_bins, max_source_positions=CFG.max_source_positions)).eval()
    hf.load_state_dict(enc.state_dict(), strict=True)
    mel = _mel(2, seed=4)
    with torch.inference_mode():
        torch.testing.assert_close(enc(mel), hf(mel).last_hidden_state, rtol=1e-5, atol=1e-5)


@torch.inference_mode()
def test_channels_last_conv_front_equals_conv1d():
    """The CUDA front end's layout trick, checked on the CPU (the same torch ops): same values as the two
    Conv1d + GELU, in [B, L', d] memory so the stream needs no transposing copy."""
    from engine.models.whisper import conv_front_channels_last

    enc = _encoder()
    mel = _mel(2)
    out = conv_front_channels_last(mel, enc.conv1, enc.conv2)
    ref = F.gelu(enc.conv2(F.gelu(enc.conv1(mel))))
    # float32 rounding of sums of 3 x 64 products up to |ref| (another summation order than Conv1d's)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6 * float(ref.abs().max()))
    assert out.shape == (2, 64, 1500) and out.transpose(1, 2).is_contiguous()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@torch.inference_mode()
def test_cuda_fused_encoder_error_matches_plain_bf16_error():
    """Whisper-medium widths on the GPU (Triton LayerNorms, packed q/k/v, channels-last convs) in bf16:
    against a float64 run of the plain computation, the fused encoder errs as much as the plain bf16
    computation does (bf16 rounding), not more."""
    import copy

    cfg = WhisperConfig(d_model=1024, encoder_layers=4, encoder_attention_heads=16, encoder_ffn_dim=4096)
    torch.manual_seed(0)
    base = WhisperEncoder(cfg).eval()
    mel = torch.randn(3, 80, 3000).cuda()
    exact = plain_encoder(copy.deepcopy(base).cuda().double(), mel.double()).float()
    plain = plain_encoder(copy.deepcopy(base).cuda().bfloat16(), mel.bfloat16()).float()
    fused = copy.deepcopy(base).cuda().bfloat16()
    fused.fuse_projections()
    ours = fused(mel.bfloat16()).float()
    assert ours.is_contiguous() and ours.shape == (3, 1500, 1024)
    err_ours, err_plain = (ours - exact).abs(), (plain - exact).abs()
    print("mean/max |err| ours", err_ours.mean().item(), err_ours.max().item(),
          "plain", err_plain.mean().item(), err_plain.max().item())
    assert err_ours.mean() < 1.25 * err_plain.mean()
    assert err_ours.max() < 2.0 * err_plain.max() + 1e-2


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@torch.inference_mode()
@pytest.mark.parametrize("m,k,n", [(1, 64, 128), (37, 384, 1536), (1500, 1024, 4096), (3001, 1280, 5120)])
def test_cuda_linear_gelu_epilogue_errs_no_more_than_the_reference(m, k, n):
    """cuBLASLt's GELU epilogue (tanh form, one rounding) vs the reference (GEMM rounded to bf16, then
    exact GELU), both against float32 with the exact GELU: the fused error is at most the reference's."""
    from engine.ops import linear as ops_linear

    g = torch.Generator(device="cuda").manual_seed(m)
    x = torch.randn(2, m, k, device="cuda", generator=g).bfloat16()
    w = (torch.randn(n, k, device="cuda", generator=g) * 1.5 / k**0.5).bfloat16()
    b = (torch.randn(n, device="cuda", generator=g) * 0.5).bfloat16()
    exact = F.gelu(x.float() @ w.float().T + b.float())
    fused = ops_linear.linear_gelu(x, w, b, ops_linear.LinearKernels(fused_gelu_gemm=True))
    ref = ops_linear.linear_gelu_reference(x, w, b)
    assert fused.shape == (2, m, n) and fused.dtype == torch.bfloat16
    assert not torch.equal(fused, ref)  # the epilogue ran (one rounding, tanh form), not the reference
    err_fused, err_ref = (fused.float() - exact).abs(), (ref.float() - exact).abs()
    print(f"{m}x{k}x{n}: mean/max |err| fused {err_fused.mean():.2e}/{err_fused.max():.2e}, "
          f"reference {err_ref.mean():.2e}/{err_ref.max():.2e}")
    assert err_fused.mean() <= err_ref.mean() * 1.05
    assert err_fused.max() <= err_ref.max() + 2e-3
