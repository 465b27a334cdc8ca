"""A draft model cut from the target itself: its first layers, embedding, final norm and head (self-speculative
decoding, as LayerSkip drafts). It shares the target's vocabulary by construction and needs no second training run;
how often it agrees with the target depends on how much the later layers change the prediction.

    python -m engine.models.layer_skip_draft TARGET_FOLDER OUT_FOLDER --layers 2
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
from pathlib import Path

_LAYER = re.compile(r"\.layers\.(\d+)\.")


def write_layer_skip_draft(target: str | Path, out: str | Path, num_layers: int) -> Path:
    """``out``: the checkpoint at ``target`` (one safetensors file or several) with only layers ``0 ..
    num_layers - 1``; the tokenizer and other files are copied as they are."""
    from safetensors.torch import load_file, save_file

    target, out = Path(target), Path(out)
    config = json.loads((target / "config.json").read_text())
    if not 1 <= num_layers <= config["num_hidden_layers"]:
        raise ValueError(f"num_layers must be in [1, {config['num_hidden_layers']}] (the target's layers), "
                         f"got {num_layers}")
    out.mkdir(parents=True, exist_ok=True)
    for path in target.iterdir():
        if path.is_file() and path.suffix != ".safetensors" and not path.name.endswith(".index.json"):
            shutil.copy2(path, out / path.name)
    config["num_hidden_layers"] = num_layers
    for key in ("layer_types", "no_rope_layers"):  # per-layer lists keep their first entries
        if isinstance(config.get(key), list):
            config[key] = config[key][:num_layers]
    (out / "config.json").write_text(json.dumps(config, indent=2))
    kept = {}
    for shard in sorted(target.glob("*.safetensors")):
        for name, tensor in load_file(shard).items():
            layer = _LAYER.search(name)
            if layer is None or int(layer.group(1)) < num_layers:
                kept[name] = tensor
    save_file(kept, out / "model.safetensors", metadata={"format": "pt"})
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("target")
    parser.add_argument("out")
    parser.add_argument("--layers", type=int, required=True, help="how many of the target's first layers to keep")
    args = parser.parse_args(argv)
    print(write_layer_skip_draft(args.target, args.out, args.layers))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
