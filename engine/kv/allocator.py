"""Free-slot allocator over the token-indexed KV pool (page size 1)."""

from __future__ import annotations

import torch


class OutOfSlots(RuntimeError):
    """Raised when more KV slots are requested than are free. The scheduler checks first, so this is a bug."""


class SlotAllocator:
    """Hands out KV slot indices ``1..num_slots``; slot 0 is the dummy that padded rows write to.

    Free slots live in a host int64 tensor (a stack); allocation takes from the end, frees append.
    Invariant: ``num_free + (slots held by live sequences) == num_slots``.
    """

    def __init__(self, num_slots: int) -> None:
        if num_slots < 1:
            raise ValueError("num_slots must be >= 1")
        self.num_slots = num_slots
        self._free = torch.arange(num_slots, 0, -1, dtype=torch.int64)
        self._top = num_slots

    @property
    def num_free(self) -> int:
        return self._top

    def alloc(self, n: int) -> torch.Tensor:
        """Return ``n`` distinct free slots, int64 ``[n]`` on the host.

        Raises:
            OutOfSlots: fewer than ``n`` slots are free.
        """
        if n > self._top:
            raise OutOfSlots(f"asked for {n} KV slots, {self._top} free")
        out = self._free[self._top - n : self._top].clone()
        self._top -= n
        return out

    def free(self, slots: torch.Tensor) -> None:
        """Return slots (int64 ``[n]``, host) to the pool. Slot 0 must never be freed."""
        n = int(slots.numel())
        if n == 0:
            return
        if self._top + n > self.num_slots:
            raise RuntimeError("double free of KV slots")
        self._free[self._top : self._top + n] = slots.to(torch.int64).cpu()
        self._top += n
