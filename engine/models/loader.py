"""Load a Hugging Face checkpoint folder (config.json + safetensors) into our paged-attention models.

Accepted layouts: a single ``model.safetensors``, or shards listed by ``model.safetensors.index.json``
(``model-00001-of-00002.safetensors`` ...). The model is built on the meta device and materialized
directly in the requested dtype and device, so no time is spent on a random initialization that the
checkpoint overwrites anyway.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors import safe_open

from engine.models.block_fp8 import dequantized_weights
from engine.models.compressed_tensors import dequantized_compressed_weights
from engine.models.config import ModelConfig
from engine.models.multimodal_text import MULTIMODAL_ARCHITECTURES, text_weights
from engine.models.llama import LlamaForCausalLM
from engine.models.registry import get_model_class, is_base_model
from engine.models.sequence_classification import is_sequence_classifier
from engine.runner.attention import AttentionBackend

logger = logging.getLogger(__name__)

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"

_DTYPES = {
    "float32": torch.float32, "fp32": torch.float32, "float": torch.float32,
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
    "float16": torch.float16, "fp16": torch.float16, "half": torch.float16,
}


def resolve_dtype(dtype: torch.dtype | str | None, config: ModelConfig) -> torch.dtype:
    """A torch dtype from a dtype, a name, or "auto"/None (the checkpoint's torch_dtype, else float32)."""
    if isinstance(dtype, torch.dtype):
        if dtype not in (torch.float32, torch.bfloat16, torch.float16):
            raise ValueError(f"dtype must be float32, bfloat16 or float16, got {dtype}")
        return dtype
    if dtype is None or dtype == "auto":
        return _DTYPES[config.torch_dtype] if config.torch_dtype else torch.float32
    try:
        return _DTYPES[str(dtype).lower()]
    except KeyError:
        raise ValueError(f"dtype must be one of auto, {', '.join(sorted(_DTYPES))}, got {dtype!r}") from None


def safetensors_files(path: str | Path) -> list[Path]:
    folder = Path(path)
    index = folder / INDEX_FILE
    if index.is_file():
        weight_map = json.loads(index.read_text()).get("weight_map")
        if not weight_map:
            raise ValueError(f"{index} has no 'weight_map'")
        files = [folder / name for name in sorted(set(weight_map.values()))]
    elif (folder / SINGLE_FILE).is_file():
        files = [folder / SINGLE_FILE]
    else:
        legacy = [name for name in ("pytorch_model.bin", "pytorch_model.bin.index.json") if (folder / name).is_file()]
        hint = (f"; it has {legacy[0]}, a pickle checkpoint this loader does not read (convert it to safetensors, "
                "e.g. save_pretrained(..., safe_serialization=True))") if legacy else ""
        raise FileNotFoundError(f"model folder {str(folder)!r} has neither {SINGLE_FILE} nor {INDEX_FILE}{hint}")
    missing = [f.name for f in files if not f.is_file()]
    if missing:
        raise FileNotFoundError(f"model folder {str(folder)!r} lacks shard(s) named in {INDEX_FILE}: {missing}")
    return files


def iterate_weights(files: list[Path]) -> Iterator[tuple[str, torch.Tensor]]:
    for file in files:
        try:
            reader_context = safe_open(str(file), framework="pt", device="cpu")
        except Exception as error:  # safetensors raises its own SafetensorError, naming no file
            raise ValueError(f"cannot read checkpoint file {str(file)!r}: {error}") from None
        with reader_context as reader:
            for name in reader.keys():
                yield name, reader.get_tensor(name)


def load_model(
    path: str | Path,
    dtype: torch.dtype | str | None = "auto",
    device: torch.device | str = "cpu",
    *,
    attention_backend: str | AttentionBackend = "torch",
    lm_head_optional: bool = False,
) -> tuple[LlamaForCausalLM, ModelConfig]:
    """(model in eval mode, its config) from a local Hugging Face checkpoint folder. ``lm_head_optional`` (an
    engine that only embeds): a checkpoint without ``lm_head.weight`` loads, with a head that refuses to run."""
    config = ModelConfig.from_pretrained(path)
    model_class = get_model_class(config)
    if is_sequence_classifier(config.architecture) and not lm_head_optional:
        raise ValueError(f"checkpoint {str(path)!r} is a {config.architecture}: it classifies and generates no text; "
                         "create the engine with runner='pooling' (vLLM's --runner pooling)")
    torch_dtype = resolve_dtype(dtype, config)
    device = torch.device(device)

    with torch.device("meta"):
        model = model_class(config, attention_backend=attention_backend)
    model = model.to(dtype=torch_dtype).to_empty(device=device)
    if model.float32_parameters:
        for name, parameter in model.named_parameters():
            if name.endswith(model.float32_parameters):
                parameter.data = torch.empty_like(parameter.data, dtype=torch.float32)

    weights = iterate_weights(safetensors_files(path))
    if config.weight_block_fp8 is not None:
        weights = dequantized_weights(weights, config.weight_block_fp8, torch_dtype)
    if config.compressed_tensors is not None:
        weights = dequantized_compressed_weights(weights, config.compressed_tensors, torch_dtype)
    if config.architecture in MULTIMODAL_ARCHITECTURES:
        weights = text_weights(weights)  # the language model's, under a text checkpoint's names
    if is_base_model(config.architecture):
        weights = ((name if name.startswith("model.") else f"model.{name}", tensor) for name, tensor in weights)
    loaded = model.load_weights(weights)
    missing = sorted(model.expected_weight_keys() - loaded)
    if "lm_head.weight" in missing and (lm_head_optional or is_base_model(config.architecture)):
        if not lm_head_optional:
            raise ValueError(f"checkpoint {str(path)!r} ({config.architecture}) has no LM head (lm_head.weight): it "
                             "can only embed; create the engine with runner='pooling'")
        missing.remove("lm_head.weight")
        model.lm_head = MissingLMHead(str(path))
    if missing:
        names = [model.checkpoint_name(key) for key in missing]
        raise ValueError(f"checkpoint {str(path)!r} is missing {len(missing)} weight(s), e.g. {names[:5]}")
    if model.unexpected_weights:
        logger.warning("checkpoint %s has %d weight(s) the model does not use, e.g. %s", path,
                       len(model.unexpected_weights), model.unexpected_weights[:5])
    model.eval().requires_grad_(False)
    return model, config


class MissingLMHead(torch.nn.Module):
    """Stands in for the LM head of a checkpoint saved without one: an embedding engine never runs it, and
    anything that tries gets an error rather than logits from uninitialized memory."""

    def __init__(self, path: str) -> None:
        super().__init__()
        self.path = path

    @property
    def weight(self) -> torch.Tensor:
        raise RuntimeError(f"checkpoint {self.path!r} has no LM head (lm_head.weight): it can only embed")


def load_tokenizer(path: str | Path):
    """The checkpoint's tokenizer, through transformers (local files only; nothing is downloaded)."""
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(str(path), local_files_only=True)
