"""The ``req_to_token`` table: (request row, logical position) -> KV slot."""

from __future__ import annotations

import torch


class ReqToTokenTable:
    """``table``: int32 ``[max_reqs + 1, max_context]`` on the engine device.

    Row 0 is the dummy row used for graph padding (all zeros, i.e. the dummy slot). Rows ``1..max_reqs`` are
    handed to live sequences; a sequence's row maps its positions ``0..len-1`` to KV slots.
    """

    def __init__(self, max_reqs: int, max_context: int, device: torch.device | str) -> None:
        self.max_reqs = max_reqs
        self.max_context = max_context
        self.table = torch.zeros((max_reqs + 1, max_context), dtype=torch.int32, device=device)
        self._free_rows = list(range(max_reqs, 0, -1))

    @property
    def num_free(self) -> int:
        return len(self._free_rows)

    def alloc(self) -> int:
        """Return a free row index (>= 1). Raises RuntimeError when none is free (the scheduler checks first)."""
        if not self._free_rows:
            raise RuntimeError("no free req_to_token row")
        return self._free_rows.pop()

    def free(self, row: int) -> None:
        """Return a row; its content is left as is (rewritten before any read by the next owner)."""
        if row <= 0 or row > self.max_reqs or row in self._free_rows:
            raise RuntimeError(f"bad or double free of req_to_token row {row}")
        self._free_rows.append(row)

    def write(self, row: int, start: int, slots: torch.Tensor) -> None:
        """Map positions ``start .. start+len(slots)-1`` of ``row`` to ``slots`` (int64/int32 ``[n]``)."""
        self.table[row, start : start + slots.numel()] = slots.to(self.table.device, torch.int32, non_blocking=True)
