"""The EAGLE proposer: a one-layer head over the target's features drafts the next tokens (engine/models/eagle.py).

The head's position p reads the target's feature at p and the token at p + 1, so it runs one position behind what the
target has computed: after a step, for every row, it catches up on the positions the target computed in this step
whose next token is known (a prefill chunk's, the verified ones of a decode: the last known token and the accepted
drafts; the features of rejected drafts are dropped), with the target's features of this very step. A row that just
sampled then drafts: its first draft from the head's output at its last caught-up position (scored by the target's
lm_head), each further draft by running the head one position on, fed its previous draft and its own previous output
in place of the target's feature, as EAGLE drafts a chain.

Invariant: for every request, the head's cache holds its KV for every position below ``num_computed[req_id]``, each
computed from the target's feature there and the known token after it. Positions the chain wrote (at or past that
count) are stale until the next catch-up rewrites them, before anything reads them. Rows share the target's block
tables, so a prefix-cache hit finds the head's KV in the same blocks (computed by the request that filled them; the KV
of a hit's last position was computed from the token that request had next, which only lowers acceptance when the
next tokens differ: verification keeps the output exact either way).
"""

from __future__ import annotations

import numpy as np
import torch

from engine.models.config import ModelConfig
from engine.models.eagle import load_eagle_head
from engine.models.eagle3 import aux_layers, load_eagle3_head, reads_aux_hidden_states
from engine.runner.input_batch import InputBatch
from engine.runner.spec_decode.draft_model import DraftModelProposer


class EagleProposer(DraftModelProposer):
    def __init__(self, path: str, num_speculative_tokens: int, *, dtype: torch.dtype, device: torch.device,
                 attention_backend: str, target_config: ModelConfig, max_model_len: int, target_model) -> None:
        self.model = self._load(path, dtype, device, attention_backend, target_config, target_model)
        self.model_config = self.model.config
        if target_config.sliding_window is not None and target_config.sliding_window_fraction == 1.0:
            # The core hands back blocks that leave every target layer's window; the head attends further back.
            raise ValueError(f"speculative_config.model {path!r}: an EAGLE head attends every position, but the "
                             f"target's blocks leave its sliding_window {target_config.sliding_window}")
        if max_model_len > self.model.max_model_len_limit:
            raise ValueError(f"speculative_config.model {path!r} supports {self.model.max_model_len_limit} tokens, "
                             f"fewer than max_model_len {max_model_len}")
        self.target = target_model
        self._init_state(num_speculative_tokens, max_model_len, dtype, device)

    @staticmethod
    def _load(path: str, dtype, device, attention_backend: str, target_config: ModelConfig, target_model):
        return load_eagle_head(path, dtype, device, attention_backend=attention_backend, target_config=target_config)

    def propose(self, batch: InputBatch, known_ends: np.ndarray, proposing_rows: list[int], metadata_builder,
                hidden_states: torch.Tensor | None = None, prepared=None) -> dict[int, list[int]]:
        common = prepared.common
        num_rows = len(known_ends)
        computed = common.num_computed_tokens[:num_rows].astype(np.int64)
        query_start = common.query_start_loc.astype(np.int64)
        slots = batch.block_table.num_blocks_per_row[:num_rows].astype(np.int64) * batch.block_table.block_size
        rows, starts, tokens, feature_rows = [], [], [], []
        for row in range(num_rows):
            scheduled = int(query_start[row + 1] - query_start[row])
            # Positions whose feature this step computed and whose next token is known, in slots the row holds.
            end = min(int(computed[row]) + scheduled, int(batch.num_tokens[row]) - 1, int(slots[row]))
            start = max(self.num_computed[batch.req_ids[row]], int(computed[row]))
            if start >= end:
                continue
            rows.append(row)
            starts.append(start)
            tokens.append(batch.token_ids_cpu[row, start + 1:end + 1])
            first = int(query_start[row]) + start - int(computed[row])
            feature_rows.append(np.arange(first, first + end - start))
            self.num_computed[batch.req_ids[row]] = end
        caught_up = {row: index for index, row in enumerate(rows)}
        # A row drafts from its last token once the head has caught up to it, at positions it holds slots for.
        num_drafts = {row: min(self.num_speculative_tokens, self.max_model_len - int(batch.num_tokens[row]),
                               int(slots[row]) - int(batch.num_tokens[row]) + 2)
                      for row in proposing_rows if row in caught_up
                      and self.num_computed[batch.req_ids[row]] == int(batch.num_tokens[row]) - 1}
        num_drafts = {row: count for row, count in num_drafts.items() if count > 0}
        if not rows:
            return {}
        features = self._target_features(hidden_states,
                                         torch.from_numpy(np.concatenate(feature_rows)).to(hidden_states.device))
        outputs = self._forward(batch, rows, np.asarray(starts), tokens, metadata_builder, features)
        drafting = list(num_drafts)
        if not drafting:
            return {}
        own = outputs[torch.tensor([caught_up[row] for row in drafting], device=outputs.device)]
        drafts = {row: [token] for row, token in zip(drafting, self._greedy(own))}
        for step in range(1, self.num_speculative_tokens):
            active = [index for index, row in enumerate(drafting) if num_drafts[row] > step]
            if not active:
                break
            active_rows = [drafting[index] for index in active]
            positions = np.array([batch.num_tokens[row] - 2 + step for row in active_rows])
            own = self._forward(batch, active_rows, positions, [np.array([drafts[row][-1]]) for row in active_rows],
                                metadata_builder, own[torch.tensor(active, device=own.device)])
            drafting = active_rows
            for row, token in zip(active_rows, self._greedy(own)):
                drafts[row].append(token)
        return drafts

    def _target_features(self, hidden_states: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """The target's features the head reads at the step's token ``rows``: its final hidden states."""
        return hidden_states[rows]

    def _greedy(self, hidden_states: torch.Tensor) -> list[int]:
        return self.target.compute_logits(hidden_states).argmax(dim=-1).tolist()

    def _model_forward(self, input_ids: torch.Tensor, positions: torch.Tensor, metadata,
                       features: torch.Tensor | None) -> torch.Tensor:
        return self.model(input_ids, positions, features, self.kv_caches, metadata, self.target.embed_input_ids)


class Eagle3Proposer(EagleProposer):
    """An EAGLE-3 head (engine/models/eagle3.py): the same catch-up and chain, reading the inputs of three of the
    target's layers (which the target's forward keeps for it) and scoring over its own vocabulary, mapped to the
    target's ids."""

    @staticmethod
    def _load(path: str, dtype, device, attention_backend: str, target_config: ModelConfig, target_model):
        reason = reads_aux_hidden_states(target_model)
        if reason is not None:
            raise ValueError(f"speculative_config method eagle3 cannot read this target's layers: {reason}")
        head = load_eagle3_head(path, dtype, device, attention_backend=attention_backend, target_config=target_config)
        target_model.model.aux_hidden_state_layers = aux_layers(len(target_model.model.layers))
        return head

    def _target_features(self, hidden_states: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        return self.model.combine([aux[rows] for aux in self.target.model.aux_hidden_states])

    def _greedy(self, hidden_states: torch.Tensor) -> list[int]:
        return self.model.greedy_target_ids(hidden_states)

