"""How a step's per-layer work divides between pipeline stages (``AnalyticalCostModel.pipeline_stage_times``): by
each stage's share of the layers, and, for a model with dense and MoE layers (DeepSeek's dense first layers), each
kind's MLPs by the layers of that kind the stage holds."""

from __future__ import annotations

from collections.abc import Sequence


def stage_kind_fractions(stage_layers: list[int], kind_counts: Sequence[int]) -> list[tuple[float, ...]]:
    """Per stage, its share of each kind of layer (``kind_counts``: dense MLP layers, then MoE layers if any); the
    dense ones are the first layers, so the first stages hold them."""
    dense_total = kind_counts[0]
    fractions, first = [], 0
    for count in stage_layers:
        dense = max(0, min(first + count, dense_total) - first)
        shares = [dense / dense_total if dense_total else 0.0]
        if len(kind_counts) > 1:
            shares.append((count - dense) / kind_counts[1] if kind_counts[1] else 0.0)
        fractions.append(tuple(shares))
        first += count
    return fractions


def stage_layer_work(per_layer_work: float, layer_fractions: Sequence[float],
                     kind_fractions: Sequence[tuple[float, ...]], mlp_times: Sequence[float] | None) -> list[float]:
    """Each stage's part of ``per_layer_work``: its share of the layers, or, given each kind's ``mlp_times`` (a
    model with both kinds), its share of the work but the MLPs and its own layers' MLPs."""
    if mlp_times is None:
        return [fraction * per_layer_work for fraction in layer_fractions]
    uniform = per_layer_work - sum(mlp_times)
    return [fraction * uniform + sum(share * mlp for share, mlp in zip(shares, mlp_times))
            for fraction, shares in zip(layer_fractions, kind_fractions)]
