"""One fused projection's adapters, stacked by slot, and the rows of a step that use them."""

from __future__ import annotations

import copy
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
    ``a_t [slots, in, rank]`` (A transposed, a slot's parts side by side in its rank
    columns, each at a multiple of its rank rounded up to 8), ``b_t [slots, out / 16, cap,
    16]`` (B transposed, in blocks of 16 output columns, so a block's rank rows adjoin),
    ``scale [slots, out]`` (each part's scaling on its rows, float32; out rounded up to 16),
    the halves in ``dtype``, and ``layout [slots, 2 + out / 16]``: the rank columns in use,
    each block's rows in use, and each block's first rank column (-1: no part there).

    Where every part starts on a block, a block holds only its own part's rows (``cap`` is
    one part's rank): a fused qkv's B is a third of the dense one, and so are its reads.
    Otherwise a block holds every rank row (zeros outside its parts add nothing).

    With ``kernel`` (a CPU with the C++ kernels built) each row is computed in one fixed
    order (``lora_add``), so its bits do not depend on the batch; elsewhere by torch's
    matmuls, a product per adapter in the step."""

    def __init__(
        self,
        slots: int,
        max_rank: int,
        parts: list[int],
        in_features: int,
        device: torch.device,
        kernel: bool,
        dtype: torch.dtype = torch.float32,
        layers: int | None = None,
    ) -> None:
        self.part_rank = -(-max_rank // RANK_STEP) * RANK_STEP
        self.starts = [sum(parts[:i]) for i in range(len(parts))]
        self.out_features = sum(parts)
        self.blocks_own_part = all(start % OUT_BLOCK == 0 for start in self.starts)
        rank = len(parts) * self.part_rank
        cap = self.part_rank if self.blocks_own_part else rank
        blocks = -(-self.out_features // OUT_BLOCK)
        lead = () if layers is None else (layers,)  # every layer's, for decode_layers
        self.a_t = torch.zeros(*lead, slots, in_features, rank, device=device, dtype=dtype)
        self.b_t = torch.zeros(*lead, slots, blocks, cap, OUT_BLOCK, device=device, dtype=dtype)
        self.scale = torch.zeros(*lead, slots, blocks * OUT_BLOCK, device=device)
        self.layout = torch.zeros(*lead, slots, 2 + blocks, dtype=torch.long, device=device)
        self.layout[..., 2:] = -1
        self.kernel = kernel

    def layer(self, index: int) -> LoraStack:
        """Layer ``index``'s stacks of a stack of every layer's: views, written through."""
        view = copy.copy(self)
        view.a_t, view.b_t = self.a_t[index], self.b_t[index]
        view.scale, view.layout = self.scale[index], self.layout[index]
        return view

    @property
    def tensors(self) -> list[torch.Tensor]:
        """What ``decode_layers`` takes for this projection."""
        return [self.a_t, self.b_t, self.scale, self.layout]

    def write(self, slot: int, parts: list[PartWeights | None]) -> None:
        """Put one adapter's parts (one per part of the projection; None: not adapted) into
        ``slot``."""
        pairs = zip(self.starts, parts, strict=True)
        adapted = [(start, pair) for start, pair in pairs if pair is not None]
        step = -(-max((pair.a.shape[0] for _, pair in adapted), default=0) // RANK_STEP)
        step *= RANK_STEP
        rank, blocks = self.a_t.shape[2], self.b_t.shape[1]
        a = torch.zeros(self.a_t.shape[1], rank)  # A.T, dense
        b = torch.zeros(rank, blocks * OUT_BLOCK)  # B.T, dense
        scale = torch.zeros(blocks * OUT_BLOCK)
        first = torch.full((blocks,), -1, dtype=torch.long)
        for index, (start, pair) in enumerate(adapted):
            low, (r, rows) = index * step, (pair.a.shape[0], pair.b.shape[0])
            a[:, low : low + r] = pair.a.T
            b[low : low + r, start : start + rows] = pair.b.T
            scale[start : start + rows] = pair.scaling
            covered = slice(start // OUT_BLOCK, -(-(start + rows) // OUT_BLOCK))
            first[covered] = low if self.blocks_own_part else 0
        if self.a_t.dtype == torch.int8:
            a, b, scale = _int8_halves(a, b, scale)
        self.a_t[slot] = a
        self.scale[slot] = scale
        used = len(adapted) * step
        by_block = b.view(rank, blocks, OUT_BLOCK).transpose(0, 1)  # [blocks, rank, 16]
        if self.blocks_own_part:
            cap = self.b_t.shape[2]
            taken = first.clamp(min=0)[:, None] + torch.arange(cap)
            by_block = by_block.gather(1, taken[:, :, None].expand(-1, -1, OUT_BLOCK))
            by_block[first < 0] = 0
        self.b_t[slot] = by_block
        self.layout[slot, :2] = torch.tensor([used, step if self.blocks_own_part else used])
        self.layout[slot, 2:] = first

    def low_rank_halves(self, slot: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(A.T [in, rank], B.T [rank, out], scale [out])`` of ``slot`` in float32."""
        rank, (blocks, cap) = self.a_t.shape[2], self.b_t.shape[1:3]
        first = self.layout[slot, 2:]
        kept = (first >= 0).nonzero().flatten()  # blocks some part writes
        rows = first[kept, None] + torch.arange(cap, device=first.device)  # [kept, cap]
        b = torch.zeros(rank, blocks, OUT_BLOCK, device=self.b_t.device)
        b[rows, kept[:, None]] = self.b_t[slot, kept].float()
        out = self.out_features
        return self.a_t[slot].float(), b.view(rank, -1)[:, :out], self.scale[slot, :out]

    @property
    def num_bytes(self) -> int:
        return self.a_t.nbytes + self.b_t.nbytes + self.scale.nbytes + self.layout.nbytes

    def add_to(self, out: torch.Tensor, x: torch.Tensor, rows: AdapterRows) -> None:
        """``out[r] += (x[r] @ A.T @ B.T) * scaling`` for each row with an adapter, computed
        in float32 and rounded once into ``out``'s dtype, as PEFT adds it."""
        x = x.reshape(x.shape[0], -1)
        if self.kernel:
            args = (rows.row_slots, self.a_t, self.b_t, self.scale, self.layout)
            torch.ops.inhouse_cpu.lora_add(out, x.contiguous(), *args)
            return
        for slot, index in rows.groups:
            a_t, b_t, scale = self.low_rank_halves(slot)
            delta = (x.index_select(0, index).float() @ a_t @ b_t) * scale
            out.index_copy_(0, index, (out.index_select(0, index).float() + delta).to(out.dtype))


def _int8_halves(
    a: torch.Tensor, b: torch.Tensor, scale: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``A.T [in, rank]``, ``B.T [rank, out]`` and ``scale [out]`` as int8 codes whose product
    is the pair's: each rank column of A over its own largest magnitude (that scale moved
    onto B's row), then each output column of B over its own, that scale folded into
    ``scale``. ``(x @ A.T @ B.T) * scale`` is then the same sum over the codes."""
    a_step = a.abs().amax(0).clamp(min=1e-30) / 127
    b = b * a_step[:, None]
    b_step = b.abs().amax(0).clamp(min=1e-30) / 127
    return (a / a_step).round(), (b / b_step).round(), scale * b_step
