"""Fused operators of the decoders and the audio encoder: one kernel where the reference runs a chain of
small ones.

Each operator has a torch reference with the exact rounding of the ``transformers`` modules it replaces
(used on the CPU and as the test oracle) and a Triton kernel used for CUDA tensors. The kernels are
imported on first CUDA use only, so CPU processes never import Triton and the kernel tests can run them
under ``TRITON_INTERPRET=1``.
"""

from engine.ops.activation import silu_and_mul
from engine.ops.linear import linear_gelu
from engine.ops.norm import add_layer_norm, add_rms_norm, layer_norm, rms_norm
from engine.ops.rotary import qk_norm_rope

__all__ = ["add_layer_norm", "add_rms_norm", "layer_norm", "linear_gelu", "qk_norm_rope", "rms_norm",
           "silu_and_mul"]
