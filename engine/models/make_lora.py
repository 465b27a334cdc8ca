"""A deterministic LoRA adapter in PEFT's format, for tests and examples (nothing is downloaded or trained).

    python -m engine.models.make_lora OUT_DIR --model small --rank 8 --alpha 16 --seed 0 [--targets q_proj,v_proj]

writes ``OUT_DIR/adapter_config.json`` and ``OUT_DIR/adapter_model.safetensors`` as PEFT saves them. PEFT
starts B at zero, so a fresh adapter changes nothing; here both halves are random, so that the adapter
visibly changes the model: A ~ N(0, 1/in_features), which keeps ``A x`` at the scale of ``x``, and
B ~ N(0, (strength / (scale * sqrt(r)))^2), which makes ``scale * B A x`` about ``strength`` times the
scale of ``x`` whatever the rank, alpha or rsLoRA (the base projections' outputs are about 0.45 times it on
the generated models: std 0.02 over 512 features). The same arguments give byte-identical files.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

from engine.models.lora_checkpoint import CONFIG_FILE, TARGET_MODULES, WEIGHTS_FILE

DEFAULT_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
DEFAULT_STRENGTH = 0.5


def _module_shapes(config: dict) -> dict[str, tuple[int, int]]:
    hidden = config["hidden_size"]
    head_dim = config.get("head_dim") or hidden // config["num_attention_heads"]
    q_size = config["num_attention_heads"] * head_dim
    kv_size = config.get("num_key_value_heads", config["num_attention_heads"]) * head_dim
    intermediate = config["intermediate_size"]
    return {"q_proj": (hidden, q_size), "k_proj": (hidden, kv_size), "v_proj": (hidden, kv_size),
            "o_proj": (q_size, hidden), "gate_proj": (hidden, intermediate), "up_proj": (hidden, intermediate),
            "down_proj": (intermediate, hidden), "qkv_proj": (hidden, q_size + 2 * kv_size),
            "gate_up_proj": (hidden, 2 * intermediate)}


def make_lora_adapter(out_dir: str | Path, model_path: str | Path, *, rank: int = 8, alpha: float = 16,
                      targets: tuple[str, ...] = DEFAULT_TARGETS, seed: int = 0, use_rslora: bool = False,
                      strength: float = DEFAULT_STRENGTH) -> Path:
    """Write the adapter for the checkpoint at ``model_path`` into ``out_dir`` and return ``out_dir``."""
    unknown = [name for name in targets if name not in TARGET_MODULES]
    if unknown or not targets:
        raise ValueError(f"targets must be some of {list(TARGET_MODULES)}, got {list(targets)}")
    if not isinstance(rank, int) or rank < 1:
        raise ValueError(f"rank must be an integer >= 1, got {rank!r}")
    if not alpha > 0:
        raise ValueError(f"alpha must be > 0, got {alpha!r}")
    model_config = json.loads((Path(model_path) / "config.json").read_text())
    shapes = _module_shapes(model_config)
    scale = alpha / math.sqrt(rank) if use_rslora else alpha / rank
    generator = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(model_config["num_hidden_layers"]):
        for name in targets:  # a fixed order: the draws, hence the files, depend only on the arguments
            in_features, out_features = shapes[name]
            prefix = f"base_model.model.model.layers.{layer}.{TARGET_MODULES[name]}.{name}"
            a = torch.randn(rank, in_features, generator=generator) / math.sqrt(in_features)
            b = torch.randn(out_features, rank, generator=generator) * (strength / (scale * math.sqrt(rank)))
            tensors[f"{prefix}.lora_A.weight"] = a.contiguous()
            tensors[f"{prefix}.lora_B.weight"] = b.contiguous()
    folder = Path(out_dir)
    folder.mkdir(parents=True, exist_ok=True)
    config = {
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": str(model_path),
        "r": rank, "lora_alpha": alpha, "lora_dropout": 0.0, "target_modules": list(targets),
        "use_rslora": use_rslora, "use_dora": False, "bias": "none", "fan_in_fan_out": False,
        "modules_to_save": None, "rank_pattern": {}, "alpha_pattern": {}, "inference_mode": True,
    }
    (folder / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
    save_file(tensors, str(folder / WEIGHTS_FILE), metadata={"format": "pt"})
    return folder


def main(argv: list[str] | None = None) -> int:
    from engine.engine_args import EngineArgs

    parser = argparse.ArgumentParser(prog="python -m engine.models.make_lora",
                                     description="Write a deterministic random LoRA adapter in PEFT's format.")
    parser.add_argument("out_dir", help="folder to write adapter_config.json and adapter_model.safetensors into")
    parser.add_argument("--model", default="small", help="'tiny', 'small' or a checkpoint folder (default: small)")
    parser.add_argument("--rank", type=int, default=8, help="r (default 8)")
    parser.add_argument("--alpha", type=float, default=16, help="lora_alpha (default 16)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random weights (default 0)")
    parser.add_argument("--targets", default=",".join(DEFAULT_TARGETS),
                        help="comma-separated target modules (default: all seven projections)")
    parser.add_argument("--use-rslora", action="store_true", help="scale by alpha / sqrt(r) instead of alpha / r")
    parser.add_argument("--strength", type=float, default=DEFAULT_STRENGTH,
                        help=f"size of the update relative to the input (default {DEFAULT_STRENGTH})")
    args = parser.parse_args(argv)
    try:
        model_path = EngineArgs(model=args.model).resolve_model_path()
        targets = tuple(name.strip() for name in args.targets.split(",") if name.strip())
        alpha = int(args.alpha) if float(args.alpha).is_integer() else args.alpha
        folder = make_lora_adapter(args.out_dir, model_path, rank=args.rank, alpha=alpha, targets=targets,
                                   seed=args.seed, use_rslora=args.use_rslora, strength=args.strength)
    except (ValueError, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"wrote a rank-{args.rank} adapter of {model_path.name} ({', '.join(targets)}) to {folder}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
