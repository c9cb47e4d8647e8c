"""Paged attention over a block-structured KV cache, built from plain torch ops.

Every layer's cache is a flat tensor of ``num_blocks * block_size`` slots, each slot
holding one token's K (or V) for all KV heads. New K/V are written by slot; a
sequence's keys are gathered block by block into a padded batch and attended with
``scaled_dot_product_attention``, so the same code runs on CPU and CUDA. On a CPU with
the C++ kernels built, every query row is attended by a kernel that reads the paged cache
in place instead, each row on its own, so a request's bits do not depend on its batch.

The metadata (slots, gather indices, masks) is built once per step by the runner
and shared by every layer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from inhouse.engine.step_interrupt import StepInterrupt

if TYPE_CHECKING:
    from inhouse.engine.lora.stack import AdapterRows


@dataclass(slots=True)
class AttentionGroup:
    """Sequences whose queries are padded together into one attention call.

    ``B`` sequences, ``Q`` = longest query run, ``K`` = longest context rounded up to
    whole blocks (keys are gathered a block at a time).
    """

    query_index: torch.Tensor | None  # [B*Q] flat token row of each padded query; None = identity
    kv_blocks: torch.Tensor  # [B*K/block_size] block ids to gather (padding reads block 0)
    mask: torch.Tensor | None  # [B, 1, G*Q, K] True = may attend; None = attend to all K
    window_mask: torch.Tensor | None  # the same, also hiding keys beyond the sliding window;
    # None = no key is that far back, sliding layers use ``mask``
    output_rows: torch.Tensor | None  # [N] rows of the padded [B*Q] output that are real tokens
    token_rows: torch.Tensor | None  # [N] flat token rows those outputs belong to
    batch: int
    query_len: int
    context_len: int
    block_size: int


@dataclass(slots=True)
class RowTables:
    """Every query row of a step, for the C++ kernel that reads the paged cache in place
    (no gather, no padding, no mask)."""

    block_tables: torch.Tensor  # [S, W] int64 block ids of the step's sequences (padded: 0)
    context_lens: torch.Tensor  # [T] int64 keys each row attends to, itself included
    block_size: int
    row_seq: torch.Tensor | None = None  # [T] each row's sequence; None: row i is sequence i
    decode: bool = False  # every entry decodes: one token, or one and a speculative draft
    pool: bool = False  # on the kernels' own pool: the step's other ops are ours too (q8/q4)
    prompt_rows: torch.Tensor | None = None  # [T] bool: a prompt's own positions, which
    # the kernel attends on bf16 products (AMX, AVX-512 BF16) where it has them; None: no such row


@dataclass(slots=True)
class AttentionMetadata:
    """Everything a layer needs to write and read the paged cache for one step."""

    slot_mapping: torch.Tensor  # [T] cache slot for each scheduled token
    groups: list[AttentionGroup]  # padded SDPA calls; empty when ``rows`` is set
    rows: RowTables | None = None  # set when the C++ kernel attends every row
    sliding_window: int = 0  # what a sliding layer passes that kernel (0: no window)
    interrupt: StepInterrupt | None = None  # stops the step before a layer (CPU steps)
    adapters: AdapterRows | None = None  # the rows each LoRA adapter adds its products to


def write_kv(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    slots: torch.Tensor,
) -> None:
    """Store the new tokens' K/V ``[T, kv_heads, head_dim]`` at their cache slots, in the
    cache's dtype."""
    k_cache.index_copy_(0, slots, k.to(k_cache.dtype))
    v_cache.index_copy_(0, slots, v.to(v_cache.dtype))


def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
    sliding: bool = False,
) -> torch.Tensor:
    """Causal attention of queries ``[T, heads, head_dim]`` over each sequence's cached K/V.

    Returns ``[T, heads * head_dim]``. Grouped-query attention is handled by folding the
    query heads that share a KV head into the query-length axis, so K/V are never repeated.
    A ``sliding`` layer sees only the last ``sliding_window`` positions (the metadata's).
    """
    if meta.rows is not None:
        window = meta.sliding_window if sliding else 0
        return _attend_rows(q, k_cache, v_cache, meta.rows, scale, window)
    num_tokens, num_heads, head_dim = q.shape
    group = num_heads // k_cache.shape[1]
    if len(meta.groups) == 1 and meta.groups[0].token_rows is None:
        return _attend_group(q, k_cache, v_cache, meta.groups[0], group, scale, sliding)
    out = q.new_empty(num_tokens, num_heads * head_dim)
    for g in meta.groups:
        rows = _attend_group(q, k_cache, v_cache, g, group, scale, sliding)
        if g.output_rows is None:
            out[g.token_rows] = rows
        else:
            out[g.token_rows] = rows[g.output_rows]
    return out


def _attend_rows(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    rows: RowTables,
    scale: float,
    window: int,
) -> torch.Tensor:
    out = torch.ops.inhouse_cpu.paged_attention_rows(
        q.float().contiguous(),
        k_cache,
        v_cache,
        rows.block_tables,
        rows.row_seq,
        rows.context_lens,
        rows.block_size,
        scale,
        window,
        not rows.pool,
        rows.prompt_rows,
    )
    return out.to(q.dtype)


def _attend_group(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    g: AttentionGroup,
    group: int,
    scale: float,
    sliding: bool,
) -> torch.Tensor:
    _, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[1]
    b, qlen, klen = g.batch, g.query_len, g.context_len
    if g.query_index is not None:
        q = q.index_select(0, g.query_index)
    # [B*Q, H, D] -> [B, KVH, G*Q, D]: the G query heads of one KV head become extra rows.
    q = q.view(b, qlen, num_kv_heads, group, head_dim).permute(0, 2, 3, 1, 4)
    q = q.reshape(b, num_kv_heads, group * qlen, head_dim)
    blocks_k = k_cache.view(-1, g.block_size, num_kv_heads, head_dim)
    blocks_v = v_cache.view(-1, g.block_size, num_kv_heads, head_dim)
    k = blocks_k.index_select(0, g.kv_blocks).to(q.dtype)  # a float16 cache, float32 queries
    v = blocks_v.index_select(0, g.kv_blocks).to(q.dtype)
    k = k.view(b, klen, num_kv_heads, head_dim).transpose(1, 2)
    v = v.view(b, klen, num_kv_heads, head_dim).transpose(1, 2)
    mask = g.window_mask if sliding and g.window_mask is not None else g.mask
    o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    o = o.view(b, num_kv_heads, group, qlen, head_dim).permute(0, 3, 1, 2, 4)
    return o.reshape(b * qlen, num_heads * head_dim)


def build_attention_metadata(
    computed: list[int],
    counts: list[int],
    block_tables: list[list[int]],
    block_size: int,
    query_group: int,
    device: torch.device,
    sliding_window: int | None = None,
    row_kernel: bool = False,
    decode: bool = False,
    prompt_lens: list[int] | None = None,
) -> tuple[AttentionMetadata, torch.Tensor]:
    """Metadata and token positions for one step.

    Entry ``i`` runs ``counts[i]`` new tokens after ``computed[i]`` cached ones, its
    tokens laid out contiguously in batch order. Single-token (decode) entries form
    one group and multi-token (prefill) entries another, so a long prefill does not
    pad every decode query. ``query_group`` is query heads per KV head. With a
    ``sliding_window`` w, sliding layers let position p see keys p-w+1 .. p (HF's rule).
    With ``row_kernel``, every token is described for the C++ kernel instead
    (:class:`RowTables`): each row takes the same arithmetic whatever runs beside it;
    ``decode`` says every entry is a decode (perhaps with a draft after its token);
    ``prompt_lens`` (per entry), given where the kernel attends a prompt's rows on tiles,
    marks the rows at a prompt's own positions.
    """
    starts = [0]
    for n in counts[:-1]:
        starts.append(starts[-1] + n)
    num_tokens = starts[-1] + counts[-1]
    tables = _padded_tables(block_tables, computed, counts, block_size)
    positions = torch.cat([torch.arange(c, c + n) for c, n in zip(computed, counts, strict=True)])
    seq_of_token = torch.repeat_interleave(torch.arange(len(counts)), torch.tensor(counts))
    slot_mapping = (
        tables[seq_of_token, positions // block_size] * block_size + positions % block_size
    )
    window = sliding_window or 0
    if row_kernel:
        row_seq = None if num_tokens == len(counts) else seq_of_token.to(device)
        rows = RowTables(tables.to(device), (positions + 1).to(device), block_size, row_seq, decode)
        if prompt_lens is not None:
            own = positions < torch.tensor(prompt_lens)[seq_of_token]
            rows.prompt_rows = own.to(device) if bool(own.any()) else None
        return AttentionMetadata(slot_mapping.to(device), [], rows, window), positions.to(device)
    decode = [i for i, n in enumerate(counts) if n == 1]
    prefill = [i for i, n in enumerate(counts) if n > 1]
    groups = [
        _group(
            members,
            starts,
            computed,
            counts,
            tables,
            block_size,
            query_group,
            num_tokens,
            device,
            sliding_window,
        )
        for members in (decode, prefill)
        if members
    ]
    meta = AttentionMetadata(slot_mapping.to(device), groups, None, window)
    return meta, positions.to(device)


def _padded_tables(
    block_tables: list[list[int]], computed: list[int], counts: list[int], block_size: int
) -> torch.Tensor:
    needed = [-(-(c + n) // block_size) for c, n in zip(computed, counts, strict=True)]
    width = max(needed)
    rows = [table[:k] + [0] * (width - k) for table, k in zip(block_tables, needed, strict=True)]
    return torch.tensor(rows, dtype=torch.long)


def _group(
    members: list[int],
    starts: list[int],
    computed: list[int],
    counts: list[int],
    tables: torch.Tensor,
    block_size: int,
    query_group: int,
    num_tokens: int,
    device: torch.device,
    sliding_window: int | None,
) -> AttentionGroup:
    start = torch.tensor([starts[i] for i in members])
    ctx = torch.tensor([computed[i] + counts[i] for i in members])
    qlen = torch.tensor([counts[i] for i in members])
    num_blocks = -(-int(ctx.max()) // block_size)
    b, q_max, k_max = len(members), int(qlen.max()), num_blocks * block_size
    j = torch.arange(q_max)
    key_pos = torch.arange(k_max)
    kv_blocks = tables[members][:, :num_blocks]
    identity = b * q_max == num_tokens and bool((qlen == q_max).all())
    query_index = (start[:, None] + torch.minimum(j[None, :], qlen[:, None] - 1)).reshape(-1)
    real = j[None, :] < qlen[:, None]
    mask = window_mask = None
    causal = not (q_max == 1 and bool((ctx == k_max).all()))
    windowed = sliding_window is not None and k_max > sliding_window
    if causal or windowed:  # a decode batch of equal contexts needs neither
        # Query j of entry i sits at position computed + j; padded queries see all the context.
        limit = torch.minimum(ctx[:, None] - qlen[:, None] + j[None, :], ctx[:, None] - 1)
        allowed = key_pos[None, None, :] <= limit[:, :, None]  # [B, Q, K]
        if causal:
            mask = _head_mask(allowed, query_group, device)
        if windowed:
            recent = key_pos[None, None, :] > limit[:, :, None] - sliding_window
            window_mask = _head_mask(allowed & recent, query_group, device)
    output_rows = real.reshape(-1).nonzero().squeeze(1)
    return AttentionGroup(
        query_index=None if identity else query_index.to(device),
        kv_blocks=kv_blocks.reshape(-1).to(device),
        mask=mask,
        window_mask=window_mask,
        output_rows=None if identity or bool(real.all()) else output_rows.to(device),
        token_rows=None if identity else query_index[output_rows].to(device),
        batch=b,
        query_len=q_max,
        context_len=k_max,
        block_size=block_size,
    )


def _head_mask(allowed: torch.Tensor, query_group: int, device: torch.device) -> torch.Tensor:
    """``[B, Q, K]`` -> ``[B, 1, G*Q, K]``: the G query heads of a KV head share a row mask."""
    b, q_max, k_max = allowed.shape
    if q_max > 1:
        allowed = allowed[:, None].expand(b, query_group, q_max, k_max)
    return allowed.reshape(b, 1, -1, k_max).to(device)
