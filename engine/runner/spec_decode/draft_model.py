"""The draft-model proposer: a smaller model of the same vocabulary guesses the next tokens, the target verifies them.

The draft keeps its own KV cache, block for block beside the target's: the same block ids and slots, so the
scheduler's block tables serve both and a prefix-cache hit finds the draft's KV where it finds the target's
(vLLM's draft models and EAGLE heads share the target's block tables the same way). After every step the draft
catches up on the tokens the target has just made known (a prefill chunk, the sampled token, accepted drafts),
then decodes its drafts greedily, one forward per draft, each written at the position the target will verify it
at. The scheduler holds ``num_speculative_tokens`` slots past each chunk for those writes
(``SchedulerConfig.num_lookahead_tokens``).

Invariant: for every request, the draft's cache holds its KV for every position below ``num_computed[req_id]``,
and those positions hold the request's known tokens. The draft's KV at a rejected draft's position is stale, and
lies at or past that count, where the next catch-up rewrites it before anything reads it.
"""

from __future__ import annotations

import numpy as np
import torch

from engine.models import load_model
from engine.models.config import ModelConfig
from engine.runner.attention import allocate_kv_caches, kv_cache_bytes_per_block
from engine.runner.attention.local_attention import local_attention_common
from engine.runner.input_batch import InputBatch
from engine.runner.prepare_inputs import CommonAttentionMetadata


class DraftModelProposer:
    def __init__(self, path: str, num_speculative_tokens: int, *, dtype: torch.dtype, device: torch.device,
                 attention_backend: str, target_config: ModelConfig, max_model_len: int) -> None:
        self.model, self.model_config = load_model(path, dtype, device, attention_backend=attention_backend)
        if self.model_config.vocab_size != target_config.vocab_size:
            raise ValueError(f"speculative_config.model {path!r} has vocab_size {self.model_config.vocab_size}, the "
                             f"target {target_config.vocab_size}: a draft model must share the target's token ids")
        window = target_config.sliding_window
        if window is not None and target_config.sliding_window_fraction == 1.0 and any(
                draft_window is None or draft_window > window for draft_window in self.model_config.layer_sliding_windows):
            # Every target layer slides, so the core hands back blocks that leave the window: a draft that reads
            # further back would read blocks that are no longer its request's.
            raise ValueError(f"speculative_config.model {path!r} attends further back than the target's "
                             f"sliding_window {window}, whose blocks are handed back as they leave it")
        if max_model_len > self.model.max_model_len_limit:
            raise ValueError(f"speculative_config.model {path!r} supports {self.model.max_model_len_limit} tokens, "
                             f"fewer than max_model_len {max_model_len}")
        self._init_state(num_speculative_tokens, max_model_len, dtype, device)

    def _init_state(self, num_speculative_tokens: int, max_model_len: int, dtype: torch.dtype,
                    device: torch.device) -> None:
        """What every proposer with a network keeps, once ``self.model`` is loaded."""
        self.model.fit_context(max_model_len)
        self.num_speculative_tokens = num_speculative_tokens
        self.max_model_len = max_model_len
        self.dtype, self.device = dtype, device
        self.kv_caches: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.num_computed: dict[str, int] = {}

    # ------------------------------------------------------------------ the cache beside the target's

    def bytes_per_block(self, block_size: int) -> int:
        config = self.model_config
        return kv_cache_bytes_per_block(config.num_hidden_layers, block_size, config.num_key_value_heads,
                                        config.head_dim, self.dtype, config.value_head_dim)

    def allocate(self, num_blocks: int, block_size: int) -> None:
        config = self.model_config
        self.kv_caches = allocate_kv_caches(config.num_hidden_layers, num_blocks, block_size,
                                            config.num_key_value_heads, config.head_dim, self.dtype, self.device,
                                            value_head_size=config.value_head_dim)

    def zero_blocks(self, index: torch.Tensor) -> None:
        for key_cache, value_cache in self.kv_caches:
            key_cache.index_fill_(0, index, 0)
            value_cache.index_fill_(0, index, 0)

    def start(self, req_id: str, num_computed_tokens: int) -> None:
        """A request (re)enters the batch with this many tokens computed: its prefix-cache hit, whose blocks hold
        the draft's KV too (whoever computed them ran the draft over them in the same step)."""
        self.num_computed[req_id] = num_computed_tokens

    def forget(self, req_id: str) -> None:
        self.num_computed.pop(req_id, None)

    # ------------------------------------------------------------------ one proposal

    def propose(self, batch: InputBatch, known_ends: np.ndarray, proposing_rows: list[int], metadata_builder,
                hidden_states: torch.Tensor | None = None, prepared=None) -> dict[int, list[int]]:
        """Catch rows ``0 .. len(known_ends) - 1`` up to ``known_ends`` (their tokens known after this step), then
        draft for ``proposing_rows`` (rows that just sampled and may speculate). Returns row -> drafts. (The target's
        ``hidden_states`` and the step's ``prepared`` inputs are for heads that read them: eagle.py.)"""
        # Only into slots the row holds: the scheduler's lookahead covers every write below, and a row whose pool
        # had no room for it (a transferred request's first step) catches up and drafts in the next step.
        slots = batch.block_table.num_blocks_per_row[:len(known_ends)].astype(np.int64) * batch.block_table.block_size
        known_ends = np.minimum(known_ends, slots)
        rows, starts = [], []
        for row, end in enumerate(known_ends.tolist()):
            start = min(self.num_computed[batch.req_ids[row]], end)
            if start < end:
                rows.append(row)
                starts.append(start)
        # A row drafts from its last token once the draft has seen it, at positions num_tokens .. it holds slots for.
        num_drafts = {row: min(self.num_speculative_tokens, self.max_model_len - int(batch.num_tokens[row]),
                               int(slots[row]) - int(batch.num_tokens[row]) + 1)
                      for row in proposing_rows if known_ends[row] == batch.num_tokens[row]}
        num_drafts = {row: count for row, count in num_drafts.items() if count > 0}
        drafts: dict[int, list[int]] = {row: [] for row in num_drafts}
        if rows:
            ends = known_ends[rows]
            tokens = [batch.token_ids_cpu[row, start:end] for row, start, end in zip(rows, starts, ends.tolist())]
            last_hidden = self._forward(batch, rows, np.asarray(starts), tokens, metadata_builder)
            for row, end in zip(rows, ends.tolist()):
                self.num_computed[batch.req_ids[row]] = end
            wanted = [index for index, row in enumerate(rows) if row in drafts]
            if wanted:
                first = self._greedy(last_hidden[torch.tensor(wanted, device=last_hidden.device)])
                for index, token in zip(wanted, first):
                    drafts[rows[index]].append(token)
        # Each further draft: one token per row still short of its count, at the position it will be verified at.
        for step in range(1, self.num_speculative_tokens):
            active = [row for row, count in num_drafts.items() if count > step and drafts[row]]
            if not active:
                break
            positions = np.array([batch.num_tokens[row] - 1 + step for row in active])
            tokens = [np.array([drafts[row][-1]]) for row in active]
            for row, token in zip(active, self._greedy(self._forward(batch, active, positions, tokens,
                                                                     metadata_builder))):
                drafts[row].append(token)
        return {row: row_drafts for row, row_drafts in drafts.items() if row_drafts}

    def _greedy(self, hidden_states: torch.Tensor) -> list[int]:
        return self.model.compute_logits(hidden_states).argmax(dim=-1).tolist()

    def _forward(self, batch: InputBatch, rows: list[int], starts: np.ndarray, tokens: list[np.ndarray],
                 metadata_builder, features: torch.Tensor | None = None) -> torch.Tensor:
        """The draft over ``tokens[i]`` of batch row ``rows[i]`` at positions ``starts[i] ..``, writing their KV into
        the row's blocks; the hidden state of each row's last token. ``features``: one row per token, for a draft
        that reads the target's (an EAGLE head, eagle.py)."""
        counts = np.array([len(row_tokens) for row_tokens in tokens], dtype=np.int64)
        cumulative = np.cumsum(counts)
        row_array = np.asarray(rows, dtype=np.int64)
        req_indices = np.repeat(row_array, counts)
        positions = np.repeat(starts.astype(np.int64), counts) + np.arange(int(cumulative[-1])) \
            - np.repeat(cumulative - counts, counts)
        seq_lens = (starts + counts).astype(np.int32)
        block_size = batch.block_table.block_size
        num_block_columns = max(1, -(-int(seq_lens.max()) // block_size))
        query_start_loc = np.zeros(len(rows) + 1, dtype=np.int32)
        query_start_loc[1:] = cumulative
        common = CommonAttentionMetadata(
            num_reqs=len(rows), num_actual_tokens=int(cumulative[-1]), query_start_loc=query_start_loc,
            seq_lens=seq_lens, num_computed_tokens=starts.astype(np.int32),
            block_table=batch.block_table.block_table[row_array, :num_block_columns].copy(),
            slot_mapping=batch.block_table.compute_slot_mapping(req_indices, positions),
            is_prefilling=starts < batch.num_prompt_tokens[row_array], max_query_len=int(counts.max()),
            max_seq_len=int(seq_lens.max()))
        input_ids = torch.from_numpy(np.concatenate(tokens).astype(np.int64)).to(self.device)
        metadata = metadata_builder.build(common)
        chunk = getattr(self.model, "attention_chunk_size", None)
        if chunk:  # a Llama 4 draft's chunked layers (engine/runner/attention/local_attention.py)
            metadata.local = metadata_builder.build(local_attention_common(common, chunk, block_size))
        hidden = self._model_forward(input_ids, torch.from_numpy(positions).to(self.device), metadata, features)
        return hidden[torch.from_numpy(cumulative - 1).to(self.device)]

    def _model_forward(self, input_ids: torch.Tensor, positions: torch.Tensor, metadata,
                       features: torch.Tensor | None) -> torch.Tensor:
        return self.model(input_ids, positions, self.kv_caches, metadata)
