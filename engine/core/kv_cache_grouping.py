"""How vLLM's hybrid KV-cache manager groups a model's layers (engine/core/hybrid_kv_cache_manager.py).

A model whose layers mix full and sliding-window attention (Gemma 2/3, Qwen's windowed layers) gets one KV-cache
group per ``group_size`` layers of one kind, so that a block of any group holds the same bytes: ``group_size`` is
the smallest count of layers of one kind, or the largest when the two are within 25% of each other (vLLM's rule:
it pads the last group of a kind with idle layers rather than make blocks of unequal size). Gemma-3-27B's 10
global and 52 local layers: groups of 10, one full and six windowed (the last with two layers and eight of
padding). A block holds ``group_size`` layers for ``block_size`` tokens; layer ``i`` of a group keeps its KV in
the group's blocks at slot ``i``, the slot every group's ``i``-th layer shares (its own blocks, not another
group's).

Pure Python: the real runner lays its KV tensors out by it, the simulator sizes its pool by it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class KVCacheGrouping:
    windows: tuple[int | None, ...]        # each group's window, None for full attention; full groups first
    layers: tuple[tuple[int, ...], ...]    # each group's layers, in model order (the last of a kind may be short)

    @property
    def layers_per_block(self) -> int:
        """vLLM's group_size: the layers one block holds (a short last group is padded to it)."""
        return max(len(layers) for layers in self.layers)

    def group_and_slot(self, layer: int) -> tuple[int, int]:
        """The group layer ``layer`` belongs to, and its slot in that group's blocks."""
        for group, layers in enumerate(self.layers):
            if layer in layers:
                return group, layers.index(layer)
        raise ValueError(f"layer {layer} is in no group of {self.layers}")


def group_layers(layer_windows: list[int | None] | tuple[int | None, ...]) -> KVCacheGrouping | None:
    """The grouping of a model whose layer ``i`` attends a window of ``layer_windows[i]`` keys (None: every key).
    None when the layers do not mix windowed and full attention (one table per request serves them). Layers with
    different windows are different kinds."""
    kinds: dict[int | None, list[int]] = {}
    for layer, window in enumerate(layer_windows):
        kinds.setdefault(window, []).append(layer)
    if len(kinds) < 2 or None not in kinds:
        return None
    counts = [len(layers) for layers in kinds.values()]
    group_size = min(counts)
    if max(counts) < group_size * 1.25:
        group_size = max(counts)
    windows: list[int | None] = []
    groups: list[tuple[int, ...]] = []
    # Full groups first, then each window's, in order of their first layer.
    for window in [None] + [window for window in kinds if window is not None]:
        layers = kinds[window]
        for start in range(0, len(layers), group_size):
            windows.append(window)
            groups.append(tuple(layers[start:start + group_size]))
    return KVCacheGrouping(tuple(windows), tuple(groups))
