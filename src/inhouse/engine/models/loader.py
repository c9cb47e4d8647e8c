"""Load a model for the engine: an HF folder, a GGUF file (converted once, then cached), or the
bundled SmolLM2 when no source is given.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import hashlib
import json
import math
import mmap
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, BinaryIO

import torch

from inhouse.engine.images import ImageSide, load_image_side
from inhouse.engine.kernels.build import load_kernels
from inhouse.engine.kernels.quant import KV_INT8_SCALE_BYTES
from inhouse.engine.models.gguf_convert import convert_gguf, main_block_type
from inhouse.engine.models.llama import LlamaArgs, LlamaForCausalLM
from inhouse.engine.models.precision import choose_precision, resolve_dtype
from inhouse.engine.models.row_blocks import describe_blocks
from inhouse.manifests.bundled import DEFAULT_CHAT_MODEL_NAME, default_chat_model
from inhouse.manifests.hashing import CACHE_FILE, HashCache, default_cache_dir
from inhouse.manifests.pickles import PickleRefused, refuse_pickle
from inhouse.plan.vision import SERVED_MODEL_TYPES


class ModelSourceError(ValueError):
    """The model source is missing or is neither an HF folder nor a GGUF file."""


@dataclass(slots=True)
class LoadedModel:
    """A ready model and everything the engine and server need to know about it."""

    model: LlamaForCausalLM
    hf_config: Any  # transformers.PretrainedConfig (a vision-language model's: its text part)
    config_dict: dict[str, Any]
    tokenizer: Any  # transformers PreTrainedTokenizerFast
    chat_template: str | None
    eos_token_ids: set[int]
    model_id: str
    source_path: Path
    source_sha256: str  # a GGUF's file sha256; a folder's config + safetensors-header digest
    dtype: torch.dtype  # activations; the KV cache's is kv_dtype
    device: torch.device
    hf_folder: Path
    quantization: str = "none"  # weight format: none, fp16, q8 or q4 (see precision.py)
    path_reason: str = ""  # why this dtype and weight format were chosen on this machine
    attention_kernel: bool = False  # every query row attended by the C++ kernel, in place
    kv_cache_dtype: str = "auto"  # or "int8": see with_kv_cache_dtype
    images: ImageSide | None = None  # a vision-language model's image processor and encoder

    @property
    def kv_dtype(self) -> torch.dtype:
        """The KV cache's dtype: int8 when asked for; else float16 under the quantized kernels
        (as llama.cpp's default cache: half the bytes a decode step's attention reads and a
        token keeps resident), else the activations' dtype, so the exact float32 path stays
        exact."""
        if self.kv_cache_dtype == "int8":
            return torch.int8
        return torch.float16 if self.quantization in ("q8", "q4") else self.dtype

    @property
    def kv_row_width(self) -> int:
        """Cache elements one token's K (or V) of one KV head takes: the head dim, and an
        int8 row's float scale (4 bytes) after its codes."""
        scale = KV_INT8_SCALE_BYTES if self.kv_dtype == torch.int8 else 0
        return self.model.args.head_dim + scale


def with_kv_cache_dtype(loaded: LoadedModel, kv_cache_dtype: str) -> LoadedModel:
    """The same model with its KV cache in ``kv_cache_dtype`` ("auto" or "int8": a scale per
    token and KV head, as vLLM's int8_per_token_head). int8 rows are written and read by the
    C++ kernels alone, so it needs their q8/q4 path with every layer's attention fused."""
    if kv_cache_dtype == loaded.kv_cache_dtype:
        return loaded
    if kv_cache_dtype == "int8":
        need = "an int8 KV cache needs the C++ CPU kernels' q8/q4 weights"
        if loaded.quantization not in ("q8", "q4"):
            raise ModelSourceError(
                f"{need}; this model runs {loaded.quantization} weights on {loaded.device.type}"
            )
        if not all(layer.self_attn.fused for layer in loaded.model.layers):
            raise ModelSourceError(
                f"{need}, and this model's per-head q/k norms keep its attention off them"
            )
    return replace(loaded, kv_cache_dtype=kv_cache_dtype)


def _folder_fingerprint(folder: Path) -> str:
    """sha256 over config.json and every safetensors file's name, size and header (not its data)."""
    digest = hashlib.sha256((folder / "config.json").read_bytes())
    for f in sorted(folder.glob("*.safetensors")):
        with f.open("rb") as fh:
            header_len = int.from_bytes(fh.read(8), "little")
            digest.update(
                f.name.encode() + f.stat().st_size.to_bytes(8, "little") + fh.read(header_len)
            )
    return digest.hexdigest()


def _resolve(source: str | Path | None, cache_dir: Path) -> tuple[Path, Path, str, str]:
    """-> (hf_folder, source_path, sha256, model_id)."""
    if source is None:
        path = default_chat_model()
        folder, sha = _cached_gguf(path, cache_dir)
        return folder, path, sha, DEFAULT_CHAT_MODEL_NAME
    path = Path(source).expanduser()
    if not (path / "config.json").is_file() or not any(path.glob("*.safetensors")):
        try:  # a .bin/.pt file, or a folder whose only weights are pickles
            refuse_pickle(path)
        except PickleRefused as err:
            raise ModelSourceError(str(err)) from None
    if path.is_file() and path.suffix == ".gguf":
        folder, sha = _cached_gguf(path, cache_dir)
        return folder, path, sha, path.name.removesuffix(".gguf")
    if path.is_dir() and (path / "config.json").is_file():
        if not any(path.glob("*.safetensors")):
            raise ModelSourceError(f"{path} has a config.json but no *.safetensors weights")
        return path, path, _folder_fingerprint(path), path.name
    raise ModelSourceError(
        f"model source {str(source)!r} is neither a .gguf file nor a folder with config.json"
    )


def _gguf_blocks(folder: Path, source: Path) -> str | None:
    """The block type most of a GGUF source's tensors have (e.g. "Q4_1"); None for a folder."""
    return main_block_type(folder, source) if source.suffix == ".gguf" else None


def _cached_gguf(path: Path, cache_dir: Path) -> tuple[Path, str]:
    sha = HashCache(cache_dir / CACHE_FILE).sha256(path)
    folder = cache_dir / "gguf" / sha
    if not (folder / "model.safetensors").is_file():
        folder.parent.mkdir(parents=True, exist_ok=True)
        convert_gguf(path, folder)
    return folder, sha


def eos_token_ids(config: Any, tokenizer: Any, folder: Path) -> set[int]:
    """End-of-sequence ids from config.json, generation_config.json and the tokenizer."""
    ids: set[int] = set()
    sources = [getattr(config, "eos_token_id", None), tokenizer.eos_token_id]
    gen_path = folder / "generation_config.json"
    if gen_path.is_file():
        sources.append(json.loads(gen_path.read_text()).get("eos_token_id"))
    for value in sources:
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, list):
            ids.update(v for v in value if isinstance(v, int))
    return ids


_SAFETENSORS_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
}


def load_weights(
    model: LlamaForCausalLM,
    folder: Path,
    on_loaded: Callable[[str], None] | None = None,
    mapped: frozenset[str] = frozenset(),
) -> None:
    """Fill the model from every ``*.safetensors`` file in ``folder``, checking completeness.

    Plain reads rather than mmap (a mapped file's touched pages count towards RSS while it
    is open), straight into the parameter when dtypes match, so loading peaks at the
    model's own size plus at most one tensor. ``on_loaded`` is called with each weight
    key once its tensor is in. A key in ``mapped`` whose file dtype is the model's compute
    dtype is not copied: its parameter becomes a copy-on-write view of the file, resident
    only where read (an embedding table: a step reads the rows of its tokens).
    """
    missing = model.weight_keys()
    for path in sorted(folder.glob("*.safetensors")):
        with path.open("rb") as f:
            header_len = int.from_bytes(f.read(8), "little")
            header = json.loads(f.read(header_len))
            header.pop("__metadata__", None)
            for name, info in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0]):
                found = model.weight_target(name)
                if found is None:
                    continue
                key, target = found
                if list(target.shape) != info["shape"]:
                    raise ModelSourceError(
                        f"{path.name}: {name} has shape {info['shape']}, "
                        f"the model expects {list(target.shape)}"
                    )
                offset = 8 + header_len + info["data_offsets"][0]
                region = None
                if key in mapped and _SAFETENSORS_DTYPES.get(info["dtype"]) == model.dtype:
                    region = _map_parameter(model, key, f, offset, info)
                else:
                    f.seek(offset)
                    _read_tensor(f, target, info, f"{path.name}: {name}")
                missing.discard(key)
                if on_loaded is not None:
                    on_loaded(key)
                if region is not None:  # drop what on_loaded read; the file backs it
                    region.madvise(mmap.MADV_DONTNEED)
    if missing:
        raise ModelSourceError(f"{folder} lacks weights: {sorted(missing)[:5]}")


def _map_parameter(
    model: LlamaForCausalLM, key: str, f: BinaryIO, offset: int, info: dict[str, Any]
) -> mmap.mmap:
    region = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
    dtype = _SAFETENSORS_DTYPES[info["dtype"]]
    view = torch.frombuffer(region, dtype=dtype, count=math.prod(info["shape"]), offset=offset)
    owner, _, leaf = key.rpartition(".")
    setattr(model.get_submodule(owner), leaf, torch.nn.Parameter(view.view(info["shape"]), False))
    return region


def _read_tensor(f: BinaryIO, target: torch.Tensor, info: dict[str, Any], what: str) -> None:
    dtype = _SAFETENSORS_DTYPES.get(info["dtype"])
    if dtype is None:
        raise ModelSourceError(f"{what} has unsupported dtype {info['dtype']}")
    start, end = info["data_offsets"]
    direct = target.dtype == dtype and target.device.type == "cpu" and target.is_contiguous()
    raw = target.view(torch.uint8) if direct else torch.empty(end - start, dtype=torch.uint8)
    if f.readinto(memoryview(raw.numpy()).cast("B")) != end - start:
        raise ModelSourceError(f"{what} is truncated")
    if not direct:
        target.copy_(raw.view(dtype).view(target.shape))


def _packing(model: LlamaForCausalLM, quantization: str) -> Callable[[str], None]:
    """The model's packer (see :meth:`LlamaForCausalLM.packer`), handing glibc's freed
    packing temporaries back to the system after each tensor, so the resident size
    tracks the model (peak ~860 MB for the bundled model with fp16 instead of ~1.1 GB)."""
    pack = model.packer(quantization)
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    trim = getattr(libc, "malloc_trim", None)

    def loaded(key: str) -> None:
        pack(key)
        if trim is not None:
            trim(0)

    return loaded


def build_model(
    hf_config: Any,
    dtype: torch.dtype,
    device: torch.device,
    weight_dtype: torch.dtype | None = None,
) -> LlamaForCausalLM:
    """An uninitialised decoder of the config's shape, rotary tables ready."""
    args = LlamaArgs.from_hf_config(hf_config)
    rope = getattr(hf_config, "rope_parameters", None) or {"rope_type": "default"}
    rope_type = rope.get("rope_type", "default")
    if rope_type == "default":
        dim = args.head_dim
        inv_freq = 1.0 / (rope["rope_theta"] ** (torch.arange(0, dim, 2, dtype=torch.float) / dim))
        scaling = 1.0
    else:
        # transformers' RoPE tables: only a scaled RoPE needs them.
        from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

        inv_freq, scaling = ROPE_INIT_FUNCTIONS[rope_type](hf_config, "cpu")
    model = LlamaForCausalLM(
        args, dtype, device, inv_freq, scaling, hf_config.max_position_embeddings, weight_dtype
    )
    return model.eval()


def load_model(
    source: str | Path | None,
    dtype: str = "auto",
    device: str = "cpu",
    cache_dir: Path | None = None,
    quantization: str = "none",
) -> LoadedModel:
    """Load ``source`` (None = bundled SmolLM2 GGUF, a .gguf file, or an HF folder).

    ``dtype`` and ``quantization`` are resolved by :func:`choose_precision`. Packed or
    quantized projections are converted one by one as they load (fp16 ones read straight
    into float16), so loading never holds every projection twice.
    """
    # transformers: loaded with a model, not with the module (start-up time).
    from transformers import AutoConfig, AutoTokenizer

    dev = torch.device(device)
    folder, path, sha, model_id = _resolve(source, cache_dir or default_cache_dir())
    precision = choose_precision(dtype, quantization, dev, source_blocks=_gguf_blocks(folder, path))
    torch_dtype, quant = precision.dtype, precision.quantization
    full_config = AutoConfig.from_pretrained(folder)
    vision = full_config.model_type in SERVED_MODEL_TYPES
    hf_config = full_config.text_config if vision else full_config
    weight_dtype = torch.float16 if quant == "fp16" else None
    model = build_model(hf_config, torch_dtype, dev, weight_dtype)
    if vision:
        model.checkpoint_prefix = "model.text_model."
    with torch.no_grad():
        if quant == "none":
            load_weights(model, folder)
        else:
            embedding = frozenset({"embed_tokens.weight"})
            load_weights(model, folder, _packing(model, quant), embedding)
    reason = precision.reason
    if quant in ("q8", "q4"):
        model.fuse_cpu_ops()
    elif dev.type == "cpu" and torch_dtype == torch.bfloat16:
        reason += f"; {_bf16_products(model)}"
    tokenizer = AutoTokenizer.from_pretrained(folder)
    images = None
    if vision:
        # the encoder in float32 beside exact float32 weights, else bf16 where the CPU has it
        exact = quant == "none" and torch_dtype == torch.float32
        encoder = torch.float32 if exact else resolve_dtype("auto", dev)
        images = load_image_side(folder, full_config, tokenizer, encoder)
        reason += f"; image encoder in {str(encoder).removeprefix('torch.')}"
    return LoadedModel(
        model=model,
        hf_config=hf_config,
        config_dict=json.loads((folder / "config.json").read_text()),
        tokenizer=tokenizer,
        chat_template=getattr(tokenizer, "chat_template", None),
        eos_token_ids=eos_token_ids(hf_config, tokenizer, folder),
        model_id=model_id,
        source_path=path,
        source_sha256=sha,
        dtype=torch_dtype,
        device=dev,
        hf_folder=folder,
        quantization=quant,
        path_reason=reason,
        attention_kernel=_attention_kernel(dev, torch_dtype, quant),
        images=images,
    )


# The kernels' bf16 units (``bf16_linear_unit``) as the start-up table's why line names them.
_BF16_UNITS = {"amx": "the AMX bf16 tiles", "avx512_bf16": "vdpbf16ps chains"}


def _bf16_products(model: LlamaForCausalLM) -> str:
    """Run a bf16 model's products on the kernels' bf16 unit where this process has one
    (AMX tiles, else AVX-512 BF16's ``vdpbf16ps``), the rest (all, elsewhere) in checked
    row blocks, and rotary and the norms in C++ where the kernels are built; one clause
    saying which."""
    packed, unit = 0, ""
    if load_kernels() is not None:
        model.fuse_bf16_ops()
        unit = torch.ops.inhouse_cpu.bf16_linear_unit()
        if unit:
            packed = model.pack_bf16_tiles()
    blocks = model.block_rows()
    where = _BF16_UNITS.get(unit, unit)
    said = [f"{packed} projections on {where}, one order at any row count"] if packed else []
    return "; ".join(said + ([describe_blocks(blocks)] if blocks else []))


def _attention_kernel(device: torch.device, dtype: torch.dtype, quantization: str) -> bool:
    """Whether attention runs on the C++ kernel: on a CPU where the kernels are built, for
    float32 and bfloat16 activations (it sums in float32 either way). It gives each query
    row the same bits whatever runs beside it or however its prompt is chunked, and gathers
    nothing."""
    if device.type != "cpu" or dtype not in (torch.float32, torch.bfloat16):
        return False
    return quantization in ("q8", "q4") or load_kernels() is not None
