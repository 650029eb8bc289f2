"""Loader for CTranslate2 Whisper checkpoints (``model.bin`` + ``config.json``).

``model.bin`` is CTranslate2's documented binary of named tensors
(``python/ctranslate2/specs/model_spec.py``, ``ModelSpec._serialize``), little endian:

    uint32 binary_version (>= 5)
    str    spec_name            # uint16 byte length, then bytes ending in NUL
    uint32 spec_revision
    uint32 num_variables
    num_variables x { str name; uint8 rank; uint32 dims[rank]; uint8 dtype; uint32 nbytes; bytes data }
    uint32 num_aliases
    num_aliases x { str alias; str variable_name }

dtype ids follow CTranslate2's ``DataType`` enum: 0 float32, 1 int8, 2 int16, 3 int32, 4 float16, 5 bfloat16.
The bundled tiny.en is float16. Scalars (rank 0) carry options such as ``encoder/num_heads``.

The Whisper spec fuses self-attention q/k/v (``self_attention/linear_0``, rows q|k|v) and the
cross-attention k/v (``attention/linear_1``, rows k|v). Whisper's k projections have no bias; CTranslate2
stores a zero bias for them, which we drop so the result uses Hugging Face ``WhisperForConditionalGeneration``
parameter names exactly.
"""

from __future__ import annotations

import json
import re
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from engine.checkpoints import CheckpointError  # defined torch-free there; importable from here as before

_DTYPES: dict[int, np.dtype] = {
    0: np.dtype("<f4"),
    1: np.dtype("i1"),
    2: np.dtype("<i2"),
    3: np.dtype("<i4"),
    4: np.dtype("<f2"),
}



@dataclass(frozen=True)
class CT2File:
    """The parsed content of a CTranslate2 ``model.bin``.

    Attributes:
        spec: spec class name, e.g. ``"WhisperSpec"``.
        revision: spec revision.
        tensors: name -> array, in the stored dtype (arrays of rank 0 for options).
    """

    spec: str
    revision: int
    tensors: dict[str, np.ndarray]


def read_ct2_model_bin(path: str | Path) -> CT2File:
    """Parse a CTranslate2 ``model.bin`` file (format in the module docstring).

    Raises:
        CheckpointError: truncated file, unknown dtype, or binary version < 5.
    """
    return parse_ct2_model_bin(Path(path).read_bytes(), str(path))


def parse_ct2_model_bin(data: bytes | bytearray, path: str = "model.bin") -> CT2File:
    """Parse the bytes of a CTranslate2 ``model.bin`` (``path`` names them in errors). The arrays are
    read-only views of ``data`` (copy them to keep them past it).

    Raises:
        CheckpointError: truncated data, unknown dtype, or binary version < 5.
    """
    pos = 0

    def take(fmt: str) -> tuple:
        nonlocal pos
        size = struct.calcsize(fmt)
        if pos + size > len(data):
            raise CheckpointError(f"{path}: truncated at byte {pos}")
        out = struct.unpack_from(fmt, data, pos)
        pos += size
        return out

    def take_str() -> str:
        nonlocal pos
        (n,) = take("<H")
        raw = data[pos : pos + n]
        pos += n
        return raw.rstrip(b"\0").decode("utf-8")

    (version,) = take("<I")
    if version < 5:
        raise CheckpointError(f"{path}: CTranslate2 binary version {version} is not supported (need >= 5)")
    spec = take_str()
    (revision,) = take("<I")
    (count,) = take("<I")
    tensors: dict[str, np.ndarray] = {}
    for _ in range(count):
        name = take_str()
        (rank,) = take("<B")
        dims = take(f"<{rank}I") if rank else ()
        (dtype_id,) = take("<B")
        (nbytes,) = take("<I")
        if dtype_id not in _DTYPES:
            raise CheckpointError(f"{path}: tensor {name} has unsupported dtype id {dtype_id}")
        if pos + nbytes > len(data):
            raise CheckpointError(f"{path}: truncated inside tensor {name}")
        arr = np.frombuffer(data, dtype=_DTYPES[dtype_id], count=nbytes // _DTYPES[dtype_id].itemsize, offset=pos)
        tensors[name] = arr.reshape(dims) if rank else arr.reshape(())
        pos += nbytes
    (n_alias,) = take("<I")
    for _ in range(n_alias):
        alias = take_str()
        target = take_str()
        tensors[alias] = tensors[target]
    return CT2File(spec=spec, revision=revision, tensors=tensors)


def _t(a: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    return torch.from_numpy(np.array(a, copy=True)).to(dtype)


def ct2_whisper_to_hf(ct2: CT2File, dtype: torch.dtype = torch.float32) -> tuple[dict[str, torch.Tensor], dict]:
    """Convert a CTranslate2 ``WhisperSpec`` to a Hugging Face Whisper state dict and a config dict.

    Returns:
        (state_dict, config): parameter names as in ``transformers.WhisperForConditionalGeneration``
        (``model.encoder.*``, ``model.decoder.*``, ``proj_out.weight``), tensors in ``dtype``;
        config holds ``d_model``, ``encoder_layers``, ``decoder_layers``, ``encoder_attention_heads``,
        ``decoder_attention_heads``, ``num_mel_bins``, ``vocab_size``, ``max_source_positions``,
        ``max_target_positions``, ``encoder_ffn_dim``, ``decoder_ffn_dim``.

    Raises:
        CheckpointError: the file is not a Whisper spec.
    """
    if ct2.spec != "WhisperSpec":
        raise CheckpointError(f"expected a WhisperSpec checkpoint, got {ct2.spec}")
    t = ct2.tensors
    sd: dict[str, torch.Tensor] = {}

    def ln(src: str, dst: str) -> None:
        sd[f"{dst}.weight"] = _t(t[f"{src}/gamma"], dtype)
        sd[f"{dst}.bias"] = _t(t[f"{src}/beta"], dtype)

    def lin(src: str, dst: str, bias: bool = True) -> None:
        sd[f"{dst}.weight"] = _t(t[f"{src}/weight"], dtype)
        if bias:
            sd[f"{dst}.bias"] = _t(t[f"{src}/bias"], dtype)

    def fused_qkv(src: str, dst: str) -> None:
        w, b = _t(t[f"{src}/weight"], dtype), _t(t[f"{src}/bias"], dtype)
        wq, wk, wv = w.chunk(3, dim=0)
        bq, _bk, bv = b.chunk(3, dim=0)
        sd[f"{dst}.q_proj.weight"], sd[f"{dst}.q_proj.bias"] = wq, bq
        sd[f"{dst}.k_proj.weight"] = wk
        sd[f"{dst}.v_proj.weight"], sd[f"{dst}.v_proj.bias"] = wv, bv

    def count(prefix: str) -> int:
        return len({k.split("/")[1] for k in t if re.match(rf"{prefix}/layer_\d+/", k)})

    n_enc, n_dec = count("encoder"), count("decoder")
    for name in ("conv1", "conv2"):
        lin(f"encoder/{name}", f"model.encoder.{name}")
    sd["model.encoder.embed_positions.weight"] = _t(t["encoder/position_encodings/encodings"], dtype)
    for i in range(n_enc):
        s, d = f"encoder/layer_{i}", f"model.encoder.layers.{i}"
        ln(f"{s}/self_attention/layer_norm", f"{d}.self_attn_layer_norm")
        fused_qkv(f"{s}/self_attention/linear_0", f"{d}.self_attn")
        lin(f"{s}/self_attention/linear_1", f"{d}.self_attn.out_proj")
        ln(f"{s}/ffn/layer_norm", f"{d}.final_layer_norm")
        lin(f"{s}/ffn/linear_0", f"{d}.fc1")
        lin(f"{s}/ffn/linear_1", f"{d}.fc2")
    ln("encoder/layer_norm", "model.encoder.layer_norm")

    sd["model.decoder.embed_tokens.weight"] = _t(t["decoder/embeddings/weight"], dtype)
    sd["model.decoder.embed_positions.weight"] = _t(t["decoder/position_encodings/encodings"], dtype)
    for i in range(n_dec):
        s, d = f"decoder/layer_{i}", f"model.decoder.layers.{i}"
        ln(f"{s}/self_attention/layer_norm", f"{d}.self_attn_layer_norm")
        fused_qkv(f"{s}/self_attention/linear_0", f"{d}.self_attn")
        lin(f"{s}/self_attention/linear_1", f"{d}.self_attn.out_proj")
        ln(f"{s}/attention/layer_norm", f"{d}.encoder_attn_layer_norm")
        lin(f"{s}/attention/linear_0", f"{d}.encoder_attn.q_proj")
        w, b = _t(t[f"{s}/attention/linear_1/weight"], dtype), _t(t[f"{s}/attention/linear_1/bias"], dtype)
        wk, wv = w.chunk(2, dim=0)
        _bk, bv = b.chunk(2, dim=0)
        sd[f"{d}.encoder_attn.k_proj.weight"] = wk
        sd[f"{d}.encoder_attn.v_proj.weight"], sd[f"{d}.encoder_attn.v_proj.bias"] = wv, bv
        lin(f"{s}/attention/linear_2", f"{d}.encoder_attn.out_proj")
        ln(f"{s}/ffn/layer_norm", f"{d}.final_layer_norm")
        lin(f"{s}/ffn/linear_0", f"{d}.fc1")
        lin(f"{s}/ffn/linear_1", f"{d}.fc2")
    ln("decoder/layer_norm", "model.decoder.layer_norm")
    sd["proj_out.weight"] = sd["model.decoder.embed_tokens.weight"]

    d_model = int(t["encoder/position_encodings/encodings"].shape[1])
    config = {
        "d_model": d_model,
        "encoder_layers": n_enc,
        "decoder_layers": n_dec,
        "encoder_attention_heads": int(t["encoder/num_heads"]),
        "decoder_attention_heads": int(t["decoder/num_heads"]),
        "num_mel_bins": int(t["encoder/conv1/weight"].shape[1]),
        "vocab_size": int(t["decoder/embeddings/weight"].shape[0]),
        "max_source_positions": int(t["encoder/position_encodings/encodings"].shape[0]),
        "max_target_positions": int(t["decoder/position_encodings/encodings"].shape[0]),
        "encoder_ffn_dim": int(t["encoder/layer_0/ffn/linear_0/weight"].shape[0]),
        "decoder_ffn_dim": int(t["decoder/layer_0/ffn/linear_0/weight"].shape[0]),
    }
    return sd, config


def load_ct2_whisper(model_dir: str | Path, dtype: torch.dtype = torch.float32) -> tuple[dict[str, torch.Tensor], dict]:
    """Read ``model_dir/model.bin`` and ``model_dir/config.json`` (CTranslate2 Whisper export).

    Returns:
        (state_dict, config) as :func:`ct2_whisper_to_hf`, with the export's ``suppress_ids``,
        ``suppress_ids_begin`` and ``alignment_heads`` (list of ``[layer, head]``) added to config.

    Raises:
        CheckpointError: missing files or wrong spec.
    """
    model_dir = Path(model_dir)
    if not (model_dir / "model.bin").is_file():
        raise CheckpointError(f"{model_dir}: no model.bin (expected a CTranslate2 Whisper export)")
    return load_ct2_whisper_bytes((model_dir / "model.bin").read_bytes(), model_dir / "config.json", dtype,
                                  str(model_dir / "model.bin"))


def load_ct2_whisper_bytes(model_bin: bytes | bytearray, config_path: Path, dtype: torch.dtype = torch.float32,
                           origin: str = "model.bin") -> tuple[dict[str, torch.Tensor], dict]:
    """:func:`load_ct2_whisper` from the bytes of a ``model.bin`` (e.g. one assembled from parts) and the
    path of the export's ``config.json`` (absent: no suppression lists); ``lang_ids`` (the language
    token ids of a multilingual export) is added to config too.

    Raises:
        CheckpointError: unreadable data or wrong spec.
    """
    sd, config = ct2_whisper_to_hf(parse_ct2_model_bin(model_bin, origin), dtype)
    extra = json.loads(config_path.read_text()) if config_path.is_file() else {}
    config["lang_ids"] = [int(x) for x in extra.get("lang_ids", [])]
    config["suppress_ids"] = list(extra.get("suppress_ids", []))
    config["suppress_ids_begin"] = list(extra.get("suppress_ids_begin", []))
    config["alignment_heads"] = [list(x) for x in extra.get("alignment_heads", [])]
    return sd, config
