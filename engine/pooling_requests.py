"""Embedding requests as the front ends add them: checked pooling parameters and the core's prompt-only request.

A pooling request reuses what the core already does for a prompt-only request (the server's ``echo`` with
``max_tokens`` 0): it asks for one token, which ends it as soon as its prompt is computed. The runner does
not sample that token (it writes a placeholder and pools the prompt's hidden states instead), and the front
end drops it. So the core needs no path of its own for requests that produce no token.
"""

from __future__ import annotations

import dataclasses

from engine.core import PoolerConfig, PoolingParams, SamplingParams

# One token (the placeholder), greedy so that no generator or sampling state is made for it.
POOLING_SAMPLING_PARAMS = SamplingParams(max_tokens=1, temperature=0.0)

GENERATE_ON_POOLING = ("this engine embeds (runner='pooling', vLLM's --runner pooling): it generates no text; "
                       "create one with runner='generate' (the default) to generate")
EMBED_ON_GENERATE = ("this engine generates (runner='generate'): embeddings need an engine created with "
                     "runner='pooling' (vLLM's --runner pooling)")
EMBED_ON_CLASSIFIER = ("this engine's model is a sequence classifier: it classifies (LLM.classify, /classify) and "
                       "scores pairs, it does not embed")
CLASSIFY_ON_EMBEDDING = ("this engine's model has no classification head (a *ForSequenceClassification checkpoint "
                         "has one): it embeds; classify needs a classifier run with runner='pooling'")


def pooling_labels(model) -> list[str] | None:
    """A pooling engine's model's classification labels (a sequence classifier's), else None (it embeds)."""
    return getattr(model, "labels", None)


def resolve_pooling_params(label: str, params: PoolingParams | None, pooler_config: PoolerConfig,
                           hidden_size: int) -> PoolingParams:
    """A copy of ``params`` with the engine's pooling type and default normalization filled in, or a ValueError
    naming the field (``dimensions`` beyond the model's hidden size)."""
    if params is None:
        params = PoolingParams()
    if not isinstance(params, PoolingParams):
        raise ValueError(f"{label}: pooling_params must be a PoolingParams, got {type(params).__name__}")
    if params.dimensions is not None and params.dimensions > hidden_size:
        raise ValueError(f"{label}: dimensions must be <= the model's hidden size {hidden_size}, "
                         f"got {params.dimensions}")
    if params.pooling_type is not None and params.pooling_type != pooler_config.pooling_type:
        raise ValueError(f"{label}: PoolingParams.pooling_type {params.pooling_type!r} differs from the engine's "
                         f"{pooler_config.pooling_type!r} (set it with pooler_config)")
    normalize = pooler_config.normalize if params.normalize is None else params.normalize
    return dataclasses.replace(params, normalize=normalize, pooling_type=pooler_config.pooling_type)
