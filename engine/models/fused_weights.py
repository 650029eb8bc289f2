"""Packed projection weights that keep the ``transformers`` parameter names.

One GEMM over a packed ``[sum(out), in]`` matrix replaces several over the same input (q/k/v, gate/up).
The HF-named parameters are rebound to row slices of the packed tensor, so ``state_dict`` and loading by
name still work and the weights are held once.
"""

from __future__ import annotations

import torch
from torch import nn


class Fusable(nn.Module):
    """A module whose fused weight (attribute ``_fused_name``) must follow ``Module.to`` / ``.float()`` /
    ``.cuda()``: those convert each parameter on its own, which would leave the fused copy behind, so it
    is rebuilt after them."""

    _fused_name: str

    def _apply(self, fn, recurse: bool = True):
        fused = getattr(self, self._fused_name, None) is not None
        out = super()._apply(fn, recurse)
        if fused:
            self.fuse_projections()
        return out

    def fuse_projections(self) -> None:
        raise NotImplementedError


def fuse_linears(linears: list[nn.Linear]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Pack ``nn.Linear`` layers over one input into ``(weight [sum(out), in], bias [sum(out)] or None)``
    and rebind each layer's parameters to their slices.

    The bias is packed when any layer has one; a layer without bias gets zero rows there (adding 0.0 to a
    float32 accumulator leaves it unchanged, so its outputs round as before). Those rows are no parameter's
    view, so nothing loaded by name can write to them.

    Raises ValueError if the layers differ in input size, dtype or device.
    """
    first = linears[0].weight
    if any(m.weight.shape[1] != first.shape[1] or m.weight.dtype != first.dtype
           or m.weight.device != first.device for m in linears):
        raise ValueError("fuse_linears needs layers of one input size, dtype and device")
    weight = torch.cat([m.weight.detach() for m in linears], dim=0)
    bias = None
    if any(m.bias is not None for m in linears):
        bias = torch.cat([m.bias.detach() if m.bias is not None else first.new_zeros(m.weight.shape[0])
                          for m in linears])
    off = 0
    for m in linears:
        n = m.weight.shape[0]
        m.weight.data = weight[off:off + n]
        if m.bias is not None:
            m.bias.data = bias[off:off + n]
        off += n
    return weight, bias
