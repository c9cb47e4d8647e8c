"""One fused projection's adapters, stacked by slot, and the rows of a step that use them."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(slots=True)
class AdapterRows:
    """A step's rows by adapter slot: ``(slot, row indices)`` for each slot in use. The rows
    of the base model are in none."""

    groups: list[tuple[int, torch.Tensor]]

    @classmethod
    def of_entries(
        cls, slots: list[int], counts: list[int], device: torch.device
    ) -> AdapterRows | None:
        """The rows of a step whose entry ``i`` runs ``counts[i]`` consecutive rows with
        adapter slot ``slots[i]`` (-1: the base); None when every entry is the base's."""
        rows: dict[int, list[int]] = {}
        start = 0
        for slot, count in zip(slots, counts, strict=True):
            if slot >= 0:
                rows.setdefault(slot, []).extend(range(start, start + count))
            start += count
        if not rows:
            return None
        return cls([(slot, torch.tensor(r, device=device)) for slot, r in sorted(rows.items())])


class LoraStack:
    """A fused projection's low-rank pairs for every slot, transposed for the products:
    ``a_t [slots, in, rank]``, ``b_t [slots, rank, out]``, ``scale [slots, out]`` (each
    part's scaling on its rows), float32, zero where a slot or a part is unused: zeros add
    nothing, so padding a part to the slot's rank leaves its products as they were.

    With ``kernel`` (a CPU with the C++ kernels built) each row is computed in one fixed
    order (``lora_add``), so its bits do not depend on the batch; elsewhere by torch's
    matmuls, a product per adapter in the step."""

    def __init__(
        self,
        slots: int,
        rank: int,
        in_features: int,
        out_features: int,
        device: torch.device,
        kernel: bool,
    ) -> None:
        self.a_t = torch.zeros(slots, in_features, rank, device=device)
        self.b_t = torch.zeros(slots, rank, out_features, device=device)
        self.scale = torch.zeros(slots, out_features, device=device)
        self.kernel = kernel

    @property
    def num_bytes(self) -> int:
        return self.a_t.nbytes + self.b_t.nbytes + self.scale.nbytes

    def add_to(self, out: torch.Tensor, x: torch.Tensor, rows: AdapterRows) -> None:
        """``out[r] += (x[r] @ A.T @ B.T) * scaling`` for each row with an adapter, computed
        in float32 and rounded once into ``out``'s dtype, as PEFT adds it."""
        for slot, index in rows.groups:
            a_t, b_t, scale = self.a_t[slot], self.b_t[slot], self.scale[slot]
            if self.kernel:
                torch.ops.inhouse_cpu.lora_add(out, x.contiguous(), index, a_t, b_t, scale)
                continue
            delta = (x.index_select(0, index).float() @ a_t @ b_t) * scale
            out.index_copy_(0, index, (out.index_select(0, index).float() + delta).to(out.dtype))
