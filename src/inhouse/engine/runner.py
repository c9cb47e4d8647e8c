"""ModelRunner: owns the paged KV cache and turns one scheduled step into logits."""

from __future__ import annotations

import math
import mmap
from collections.abc import Mapping
from contextlib import AbstractContextManager

import torch

from inhouse.engine.attention import build_attention_metadata
from inhouse.engine.images import gather_image_rows
from inhouse.engine.lora.stack import AdapterRows
from inhouse.engine.models.loader import LoadedModel
from inhouse.engine.sequence import Sequence
from inhouse.engine.step_interrupt import StepInterrupt
from inhouse.engine.threads import step_threads


class ModelRunner:
    """Runs the model over a batch of sequences, each catching up some of its tokens.

    The KV cache is one tensor ``[layers, 2 (K/V), num_blocks * block_size, kv_heads, row]``
    in the model's KV dtype, allocated once (row: the head dim; an int8 row's scale after
    it). Block ``b`` owns slots ``b*block_size .. (b+1)*block_size - 1``.
    """

    def __init__(self, loaded: LoadedModel, num_blocks: int, block_size: int) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError(
                f"need num_blocks >= 1 and block_size >= 1, got {num_blocks}, {block_size}"
            )
        self.model = loaded.model
        self.images = loaded.images
        self.device = loaded.device
        self.num_blocks = num_blocks
        self.block_size = block_size
        args = loaded.model.args
        self.query_group = args.num_heads // args.num_kv_heads
        self.sliding_window = args.sliding_window
        self.max_positions = loaded.model.rope_cos.shape[0]
        self.attention_kernel = loaded.attention_kernel
        # a prompt's own rows attended on bf16 products (AMX tiles, else AVX-512 BF16; a
        # generated token's never), where the weights are int8/int4 or bf16 already: a
        # float32 or float16 model keeps float32
        lossy = loaded.quantization in ("q8", "q4") or loaded.model.dtype == torch.bfloat16
        self.prompt_tiles = (
            self.attention_kernel
            and lossy
            and bool(torch.ops.inhouse_cpu.prompt_attention_tiles(args.head_dim))
        )
        # q8/q4 (and bf16-tile) steps run on the kernels' pool alone: OpenMP's threads,
        # still spinning after an attention call, would take the cores from the next linear
        self.kernel_pool = loaded.quantization in ("q8", "q4") or loaded.model.bf16_tiles
        row = loaded.kv_row_width
        shape = (args.num_layers, 2, num_blocks * block_size, args.num_kv_heads, row)
        self.kv_cache = _zeroed(shape, loaded.kv_dtype, loaded.device)
        self.kv_bytes_per_token = (
            2 * args.num_layers * args.num_kv_heads * row * self.kv_cache.element_size()
        )
        self.kv_bytes_per_block = self.kv_bytes_per_token * block_size

    @torch.inference_mode()
    def execute(
        self,
        batch: list[tuple[Sequence, int]],
        drafts: Mapping[int, list[int]] | None = None,
        interrupt: StepInterrupt | None = None,
    ) -> torch.Tensor:
        """Float32 logits at each entry's last scheduled token, and at its draft tokens.

        Entry ``(seq, n)`` runs ``seq.token_ids[c:c+n]`` with ``c = seq.num_computed_tokens``,
        writing their K/V into ``seq.block_table`` and attending over positions ``0..c+n-1``.
        An entry ``i`` with ``drafts[i]`` runs its sequence's tokens followed by the draft
        (``n`` counts both) and gets ``1 + len(drafts[i])`` logits rows, its last ones;
        every other entry gets one. ``seq`` is not modified. With an ``interrupt`` (CPU
        only), a stop it is asked for raises StepAbandoned before the next layer.
        """
        if not batch:
            raise ValueError("execute() needs at least one (sequence, num_tokens) entry")
        with self.threads():
            return self._execute(batch, drafts or {}, interrupt)

    def threads(self) -> AbstractContextManager[None]:
        """The CPU threads a step of this model runs with (see :func:`step_threads`)."""
        return step_threads(self.device, self.kernel_pool)

    def _execute(
        self,
        batch: list[tuple[Sequence, int]],
        drafts: Mapping[int, list[int]],
        interrupt: StepInterrupt | None,
    ) -> torch.Tensor:
        computed, counts, tables, tokens, logit_rows = [], [], [], [], []
        for i, (seq, n) in enumerate(batch):
            c = seq.num_computed_tokens
            draft = drafts.get(i, [])
            if n < 1 or c + n > len(seq.token_ids) + len(draft) or c + n > self.max_positions:
                raise ValueError(
                    f"sequence {seq.seq_id}: cannot run {n} tokens after {c} "
                    f"of {len(seq.token_ids)} (max positions {self.max_positions})"
                )
            if len(seq.block_table) * self.block_size < c + n:
                raise ValueError(f"sequence {seq.seq_id}: block table too short for {c + n} tokens")
            computed.append(c)
            counts.append(n)
            tables.append(seq.block_table)
            tokens.extend((seq.token_ids[c:] + draft)[:n] if draft else seq.token_ids[c : c + n])
            end = len(tokens)
            logit_rows.extend(range(end - len(draft) - 1, end))
        meta, positions = build_attention_metadata(
            computed,
            counts,
            tables,
            self.block_size,
            self.query_group,
            self.device,
            self.sliding_window,
            self.attention_kernel,
            decode=all(n == 1 or i in drafts for i, (_, n) in enumerate(batch)),
            prompt_lens=[seq.num_prompt_tokens for seq, _ in batch] if self.prompt_tiles else None,
        )
        if meta.rows is not None:
            meta.rows.pool = self.kernel_pool
        if self.device.type == "cpu":
            meta.interrupt = interrupt
        slots = [-1 if seq.adapter is None else seq.adapter.slot for seq, _ in batch]
        meta.adapters = AdapterRows.of_entries(slots, counts, self.device)
        input_ids = torch.tensor(tokens, dtype=torch.long).to(self.device)
        every_row = len(logit_rows) == len(tokens)  # each entry decodes (drafts included)
        rows = None if every_row else torch.tensor(logit_rows).to(self.device)
        return self.model(input_ids, positions, self.kv_cache, meta, rows, self._image_rows(batch))

    def _image_rows(
        self, batch: list[tuple[Sequence, int]]
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The step's rows that take an image's encoder rows, and those rows (None: none)."""
        if self.images is None or not any(seq.images for seq, _ in batch):
            return None
        entries = [(seq.images, seq.num_computed_tokens, n) for seq, n in batch]
        rows, features = gather_image_rows(entries, self.images.encode)
        if not rows:
            return None
        return torch.tensor(rows, device=self.device), torch.cat(features).to(self.device)


def _zeroed(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A zero tensor; on CPU backed by an anonymous mapping, so the kernel hands out zero
    pages lazily and a block costs resident memory only once a token is written to it."""
    if device.type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    nbytes = math.prod(shape) * torch.empty(0, dtype=dtype).element_size()
    return torch.frombuffer(mmap.mmap(-1, nbytes), dtype=dtype).view(shape)
