"""DeepSeek-V3's multi-token-prediction (MTP) module as a speculative-decoding proposer (vLLM's ``method: mtp``,
which DeepSeek-V3/R1 deployments use to draft one or a few tokens per step).

The module that DeepSeek trained beside the model (``num_nextn_predict_layers``: one for V3/R1) is one more decoder
layer of the model's own kind (latent attention and an MoE MLP), fed the previous position's hidden state joined
with the next token's embedding (two norms and a 2 x hidden -> hidden projection, ``eh_proj``), with its own
embedding and output head. vLLM loads it from the checkpoint and runs it as the draft: each proposal is one pass of
that layer and the head, the first over the step's tokens, the rest over each request's last draft, and its layer
keeps a KV cache of its own in the same block layout as the model's.

The simulator prices it as a draft model (``sim/speculation.py``): a one-layer model of the target's shape, in the
target's dtype and weight quantization, its embedding and head counted (the checkpoint's 14B for DeepSeek-V3:
11.5B of layer, 1.9B of embedding and head). ``eh_proj`` (0.1B, a projection of one row per token) is left out.
"""

from __future__ import annotations

from dataclasses import replace

from sim.model_shapes import ModelShape


def mtp_draft_shape(model: ModelShape) -> ModelShape:
    """The MTP module of ``model`` as a one-layer draft model; a ValueError naming the field when it has none."""
    if model.num_mtp_layers < 1:
        raise ValueError(f"method: mtp drafts with the model's multi-token-prediction module, but {model.name!r} has "
                         "none (model.num_mtp_layers is 0; a config.json's num_nextn_predict_layers); use method "
                         "ngram or draft_model")
    # The module's layer is an MoE layer when the model has experts (DeepSeek's dense layers are its first few).
    return replace(model, name=f"{model.name} MTP module", num_layers=1, num_dense_layers=0, num_mtp_layers=0)
