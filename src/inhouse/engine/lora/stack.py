"""One fused projection's adapters, stacked by slot, and the rows of a step that use them."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from inhouse.plan.adapters import OUT_BLOCK, RANK_STEP  # the layout the plan counts too


@dataclass(frozen=True, slots=True)
class PartWeights:
    """One checkpoint projection's low-rank pair: ``A [r, in]``, ``B [out, r]``, float32."""

    a: torch.Tensor
    b: torch.Tensor
    scaling: float


@dataclass(slots=True)
class AdapterRows:
    """A step's rows by adapter: ``row_slots [T]``, each row's slot (-1: the base), for the
    C++ kernel, and ``groups``, ``(slot, row indices)`` for each slot in use, for torch
    (found on first use: the kernel's steps never need them)."""

    row_slots: torch.Tensor
    _groups: list[tuple[int, torch.Tensor]] | None = None

    @property
    def groups(self) -> list[tuple[int, torch.Tensor]]:
        if self._groups is None:
            slots = sorted(set(self.row_slots.tolist()) - {-1})
            self._groups = [(s, (self.row_slots == s).nonzero().flatten()) for s in slots]
        return self._groups

    @classmethod
    def of_entries(
        cls, slots: list[int], counts: list[int], device: torch.device
    ) -> AdapterRows | None:
        """The rows of a step whose entry ``i`` runs ``counts[i]`` consecutive rows with
        adapter slot ``slots[i]`` (-1: the base); None when every entry is the base's."""
        if all(slot < 0 for slot in slots):
            return None
        per_row = [slot for slot, count in zip(slots, counts, strict=True) for _ in range(count)]
        return cls(torch.tensor(per_row, dtype=torch.long, device=device))


class LoraStack:
    """A fused projection's low-rank pairs for every slot, laid out for the products:
    ``a_t [slots, in, rank]`` (A transposed), ``b_t [slots, out / 16, rank, 16]`` (B
    transposed, in blocks of 16 output columns, so a block's rank rows adjoin), ``scale
    [slots, out]`` (each part's scaling on its rows, float32; out rounded up to 16), the
    halves in ``dtype``; a slot's parts sit side by side in its first ``used`` rank
    columns, zero beyond: zeros add nothing, so the padding leaves the products as they were.

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
        dtype: torch.dtype = torch.float32,
    ) -> None:
        rank = -(-rank // RANK_STEP) * RANK_STEP
        blocks = -(-out_features // OUT_BLOCK)
        self.out_features = out_features
        self.a_t = torch.zeros(slots, in_features, rank, device=device, dtype=dtype)
        self.b_t = torch.zeros(slots, blocks, rank, OUT_BLOCK, device=device, dtype=dtype)
        self.scale = torch.zeros(slots, blocks * OUT_BLOCK, device=device)
        self.used = torch.zeros(slots, dtype=torch.long, device=device)  # rank columns in use
        self.kernel = kernel

    @property
    def tensors(self) -> list[torch.Tensor]:
        """What ``decode_layers`` takes for this projection."""
        return [self.a_t, self.b_t, self.scale, self.used]

    def write(self, slot: int, parts: list[tuple[int, PartWeights | None]]) -> None:
        """Put one adapter's parts (each at its first output row; None: not adapted) into
        ``slot``, their rank columns side by side."""
        self.a_t[slot].zero_()
        self.scale[slot].zero_()
        b = torch.zeros(self.b_t.shape[2], self.scale.shape[1])  # B.T, [rank, out padded]
        low = 0
        for start, pair in parts:
            if pair is None:
                continue
            rank, rows = pair.a.shape[0], pair.b.shape[0]
            self.a_t[slot, :, low : low + rank] = pair.a.T
            b[low : low + rank, start : start + rows] = pair.b.T
            self.scale[slot, start : start + rows] = pair.scaling
            low += rank
        blocks = self.b_t.shape[1]
        self.b_t[slot] = b.view(-1, blocks, OUT_BLOCK).transpose(0, 1)
        self.used[slot] = -(-low // RANK_STEP) * RANK_STEP

    def low_rank_halves(self, slot: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(A.T [in, rank], B.T [rank, out], scale [out])`` of ``slot`` in float32."""
        b = self.b_t[slot].transpose(0, 1).reshape(self.b_t.shape[2], -1)
        out = self.out_features
        return self.a_t[slot].float(), b[:, :out].float(), self.scale[slot, :out]

    @property
    def num_bytes(self) -> int:
        return self.a_t.nbytes + self.b_t.nbytes + self.scale.nbytes

    def add_to(self, out: torch.Tensor, x: torch.Tensor, rows: AdapterRows) -> None:
        """``out[r] += (x[r] @ A.T @ B.T) * scaling`` for each row with an adapter, computed
        in float32 and rounded once into ``out``'s dtype, as PEFT adds it."""
        x = x.reshape(x.shape[0], -1)
        if self.kernel:
            args = (rows.row_slots, self.a_t, self.b_t, self.scale, self.used)
            torch.ops.inhouse_cpu.lora_add(out, x.contiguous(), *args)
            return
        for slot, index in rows.groups:
            a_t, b_t, scale = self.low_rank_halves(slot)
            delta = (x.index_select(0, index).float() @ a_t @ b_t) * scale
            out.index_copy_(0, index, (out.index_select(0, index).float() + delta).to(out.dtype))
