"""Idefics3's and SmolVLM's image side: a SigLIP encoder over the tiles of an image, and
the connector that pixel-shuffles each tile's patches into fewer, wider rows and projects them
into the decoder's embedding space. Its output rows stand in the prompt where the processor
wrote the image token.

The encoder reads images of any aspect: a tile padded past its image carries a pixel mask;
padded patches are not attended to, and the real ones get positions spread over the full
grid (NaViT's fractional buckets), as the model was trained.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

CHECKPOINT_PREFIXES = ("model.vision_model.", "model.connector.")
IMAGE, AROUND, GLOBAL = "<image>", "<fake_token_around_image>", "<global-img>"


def idefics3_placeholder(rows: int, cols: int, tokens_per_tile: int) -> str:
    """The prompt text standing for an image cut into ``rows`` x ``cols`` tiles plus its
    whole (0 x 0: the whole alone), as Idefics3's and SmolVLM's processors write it: each
    tile marked with its place, a row of tiles ended by a newline, the whole image last."""
    tile = IMAGE * tokens_per_tile
    whole = f"{AROUND}{GLOBAL}{tile}{AROUND}"
    if rows == 0 and cols == 0:
        return whole
    grid = "".join(
        "".join(f"{AROUND}<row_{r + 1}_col_{c + 1}>{tile}" for c in range(cols)) + "\n"
        for r in range(rows)
    )
    return f"{grid}\n{whole}"


class EncoderLayer(nn.Module):
    """Pre-norm attention and a tanh-GELU MLP, each added back to the residual."""

    def __init__(self, hidden: int, intermediate: int, heads: int, eps: float) -> None:
        super().__init__()
        self.heads = heads
        self.layer_norm1 = nn.LayerNorm(hidden, eps=eps)
        self.layer_norm2 = nn.LayerNorm(hidden, eps=eps)
        self.q_proj, self.k_proj, self.v_proj, self.out_proj = (
            nn.Linear(hidden, hidden) for _ in range(4)
        )
        self.fc1 = nn.Linear(hidden, intermediate)
        self.fc2 = nn.Linear(intermediate, hidden)

    def forward(self, h: torch.Tensor, key_mask: torch.Tensor | None) -> torch.Tensor:
        tiles, patches, hidden = h.shape
        x = self.layer_norm1(h)
        q, k, v = (
            proj(x).view(tiles, patches, self.heads, -1).transpose(1, 2)
            for proj in (self.q_proj, self.k_proj, self.v_proj)
        )
        attended = F.scaled_dot_product_attention(q, k, v, attn_mask=key_mask)
        h = h + self.out_proj(attended.transpose(1, 2).reshape(tiles, patches, hidden))
        return h + self.fc2(F.gelu(self.fc1(self.layer_norm2(h)), approximate="tanh"))


class Idefics3Vision(nn.Module):
    """Tiles ``[n, 3, H, W]`` (and their pixel masks) to ``n * tokens_per_tile`` decoder rows."""

    def __init__(self, vision: Any, scale_factor: int, text_hidden: int) -> None:
        """``vision``: transformers' vision config object (its class fills the keys a
        published ``config.json`` leaves out)."""
        super().__init__()
        hidden = vision.hidden_size
        self.patch = vision.patch_size
        self.side = vision.image_size // self.patch  # patches along a full tile's edge
        self.scale = scale_factor
        self.tokens_per_tile = self.side**2 // self.scale**2
        if vision.hidden_act != "gelu_pytorch_tanh":
            raise ValueError(f"vision activation {vision.hidden_act!r} is not supported")
        self.patch_embedding = nn.Conv2d(vision.num_channels, hidden, self.patch, stride=self.patch)
        self.position_embedding = nn.Embedding(self.side**2, hidden)
        eps, heads = vision.layer_norm_eps, vision.num_attention_heads
        self.layers = nn.ModuleList(
            EncoderLayer(hidden, vision.intermediate_size, heads, eps)
            for _ in range(vision.num_hidden_layers)
        )
        self.post_layernorm = nn.LayerNorm(hidden, eps=eps)
        self.projection = nn.Linear(hidden * self.scale**2, text_hidden, bias=False)

    @torch.inference_mode()
    def forward(self, pixels: torch.Tensor, pixel_mask: torch.Tensor) -> torch.Tensor:
        """Decoder-space rows for the tiles, tile by tile, in the order the prompt takes them."""
        tiles = pixels.shape[0]
        patch_mask = self._patch_mask(pixel_mask)
        h = self.patch_embedding(pixels.to(self.projection.weight.dtype)).flatten(2).transpose(1, 2)
        h = h + self.position_embedding(self._position_ids(patch_mask))
        keys = patch_mask.view(tiles, 1, 1, -1)
        key_mask = None if bool(keys.all()) else keys
        for layer in self.layers:
            h = layer(h, key_mask)
        h = self.post_layernorm(h)
        return self.projection(self._pixel_shuffle(h)).reshape(-1, self.projection.out_features)

    def _patch_mask(self, pixel_mask: torch.Tensor) -> torch.Tensor:
        """``[tiles, rows, cols]``: the patches with at least one real pixel."""
        tiles, height, width = pixel_mask.shape
        p = self.patch
        grid = pixel_mask.view(tiles, height // p, p, width // p, p)
        return grid.amax(dim=(2, 4)) > 0

    def _position_ids(self, patch_mask: torch.Tensor) -> torch.Tensor:
        """Each real patch's place on the full grid: its fractional row and column bucketed
        into ``side`` steps; padded patches take position 0."""
        tiles, rows, cols = patch_mask.shape
        boundaries = torch.arange(1 / self.side, 1.0, 1 / self.side)

        def buckets(real: torch.Tensor, length: int) -> torch.Tensor:
            step = 1.0 / real.to(torch.float32)
            fraction = torch.arange(length, dtype=torch.float32)[None, :] * step[:, None]
            return torch.bucketize(fraction.clamp(max=1.0 - 1e-6), boundaries, right=True)

        along_rows = buckets(patch_mask[:, :, 0].sum(1), rows)
        along_cols = buckets(patch_mask[:, 0, :].sum(1), cols)
        ids = (along_rows[:, :, None] * self.side + along_cols[:, None, :]).view(tiles, -1)
        return torch.where(patch_mask.view(tiles, -1), ids, 0)

    def _pixel_shuffle(self, h: torch.Tensor) -> torch.Tensor:
        """``[tiles, side², d]`` to ``[tiles, side²/s², d·s²]``: each s×s square of patches
        becomes one row, its patches' features side by side as the model was trained."""
        tiles, patches, d = h.shape
        side, s = self.side, self.scale
        x = h.view(tiles, side, side // s, d * s).permute(0, 2, 1, 3)
        x = x.reshape(tiles, side // s, side // s, d * s * s).permute(0, 2, 1, 3)
        return x.reshape(tiles, patches // (s * s), d * s * s)


# checkpoint name prefixes and what they are called here; then the layers' sub-module names
_PREFIXES = (
    ("model.vision_model.embeddings.", ""),
    ("model.vision_model.encoder.layers.", "layers."),
    ("model.vision_model.", ""),
    ("model.connector.modality_projection.proj.", "projection."),
)
_FLATTENED = (".self_attn.", ".mlp.")


def _local_name(checkpoint_name: str) -> str:
    name = checkpoint_name
    for old, new in _PREFIXES:
        if name.startswith(old):
            name = new + name[len(old) :]
            break
    for part in _FLATTENED:
        name = name.replace(part, ".")
    return name


def load_idefics3_vision(folder: Path, config: Any, dtype: torch.dtype) -> Idefics3Vision:
    """The image side of the checkpoint in ``folder`` (``config``: its transformers config),
    every tensor checked present."""
    from safetensors import safe_open

    text_hidden = config.text_config.hidden_size
    tower = Idefics3Vision(config.vision_config, config.scale_factor, text_hidden)
    wanted = tower.state_dict()
    loaded: dict[str, torch.Tensor] = {}
    for path in sorted(folder.glob("*.safetensors")):
        with safe_open(str(path), "pt") as f:
            for name in f.keys():  # noqa: SIM118 (safe_open is not a mapping)
                if name.startswith(CHECKPOINT_PREFIXES):
                    local = _local_name(name)
                    if local not in wanted:
                        raise ValueError(f"{path.name}: unexpected image-side tensor {name!r}")
                    loaded[local] = f.get_tensor(name)
    missing = sorted(set(wanted) - set(loaded))
    if missing:
        raise ValueError(f"{folder} lacks image-side weights: {missing[:5]}")
    tower.load_state_dict(loaded)
    return tower.to(dtype).eval()
