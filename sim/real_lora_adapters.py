"""The adapters a real run of a LoRA workload serves: generated for the run's model, on disk, in PEFT's format.

A workload's ``lora`` section names adapters by shape only (``adapter-i``: a rank and the modules it adapts),
which is all the simulator prices. A real runner needs weights: each adapter is generated for the run's model,
deterministically (engine/models/make_lora.py; random A and B whose update is half the input's size, so the
adapters change the computation as trained ones do while costing exactly what any adapter of that shape
costs), and kept under the cache (``$SERVESIM_CACHE/adapters/<model folder>/``) keyed by everything that
determines its bytes. A real run's cost is the adapter's shape, not its values, so random weights measure
what a trained adapter would.

The adapter's folder is written next to its final name and renamed into place, so a run interrupted while
writing never leaves a half-written adapter that a later run would take as complete.

For a server run (``sim.run --executor server``), ``python -m sim.real_lora_adapters WORKLOAD [--model M]``
writes the same adapters and prints the ``engine.serve`` flags that serve them under the names the workload's
requests ask for (``adapter-i``), with the workload's adapter slots.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import sys
from pathlib import Path

from workloads import WorkloadConfig
from workloads.lora_section import AdapterSpec

# lora_alpha = ALPHA_PER_RANK x rank: the scale alpha / r is then the same for every rank.
ALPHA_PER_RANK = 2


def adapter_folder(root: Path, model_path: Path, spec: AdapterSpec, seed: int) -> Path:
    key = f"{spec.name}|{spec.int_id}|{spec.rank}|{','.join(spec.target_modules)}|{seed}"
    digest = hashlib.sha256(key.encode()).hexdigest()[:12]
    return root / "adapters" / model_path.name / f"{spec.name}-r{spec.rank}-{digest}"


def write_workload_adapters(workload: WorkloadConfig, model_path: str | Path, cache_root: str | Path
                            ) -> dict[str, str]:
    """Each adapter of ``workload`` on disk for the model at ``model_path``: adapter name -> folder. Adapter i
    of a workload with seed s is drawn with seed ``s * 1_000_003 + i`` (its runner id), so the adapters differ
    from one another and from one workload seed to another."""
    from engine.models.make_lora import make_lora_adapter

    model_path, root = Path(model_path), Path(cache_root)
    paths: dict[str, str] = {}
    for spec in workload.lora_adapters().values():
        seed = workload.seed * 1_000_003 + spec.int_id
        folder = adapter_folder(root, model_path, spec, seed)
        if not folder.is_dir():
            partial = folder.with_name(f"{folder.name}.partial-{os.getpid()}")
            shutil.rmtree(partial, ignore_errors=True)
            make_lora_adapter(partial, model_path, rank=spec.rank, alpha=ALPHA_PER_RANK * spec.rank,
                              targets=tuple(spec.target_modules), seed=seed)
            try:
                partial.rename(folder)
            except OSError:
                if not folder.is_dir():  # another process put it there first: theirs is identical
                    raise
                shutil.rmtree(partial, ignore_errors=True)
        paths[spec.name] = str(folder)
    return paths


def server_flags(workload: WorkloadConfig, paths: dict[str, str]) -> list[str]:
    """The engine.serve flags that serve ``paths`` (adapter name -> folder) with the workload's adapter slots."""
    section = workload.engine
    return ["--enable-lora", "--max-loras", str(max(section.max_loras, 1)), "--max-lora-rank",
            str(section.max_lora_rank), "--max-cpu-loras", str(max(section.cpu_lora_capacity(), 1)),
            "--lora-modules", *(f"{name}={path}" for name, path in sorted(paths.items(),
                                                                        key=lambda item: int(item[0].split("-")[-1])))]


def main(argv: list[str] | None = None) -> int:
    from engine.engine_args import EngineArgs
    from engine.models.default_model import cache_root
    from workloads import WorkloadError, load_workload

    parser = argparse.ArgumentParser(prog="python -m sim.real_lora_adapters",
                                     description="Write a LoRA workload's adapters for a model and print the "
                                                 "engine.serve flags that serve them.")
    parser.add_argument("workload", help="a workload YAML (or an example's name) with a lora section")
    parser.add_argument("--model", default=None, help="tiny, small (the default) or a checkpoint folder")
    parser.add_argument("--set", action="append", default=[], metavar="PATH=VALUE", help="a workload override")
    args = parser.parse_args(argv)
    try:
        from sim.run import resolve_workload_path

        workload = load_workload(resolve_workload_path(args.workload), overrides=args.set)
        if not workload.lora_adapters():
            raise ValueError(f"{args.workload}: the workload names no LoRA adapter (no workload.lora section)")
        paths = write_workload_adapters(workload, EngineArgs(model=args.model).resolve_model_path(), cache_root())
    except (WorkloadError, ValueError, FileNotFoundError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(" ".join(server_flags(workload, paths)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
