"""The runner's part of a step with drafts: feed them, verify them, propose the next ones.

Drafts are written into the persistent batch's token buffer just past each request's known tokens, so
``prepare_inputs`` feeds them like any other token (positions ``num_tokens ..``); ``num_tokens`` does not move
until verification keeps some. Rejected drafts stay in the buffer past ``num_tokens``, where nothing reads them
before they are overwritten.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np
import torch

from engine.runner.input_batch import InputBatch
from engine.runner.prepare_inputs import PreparedInputs
from engine.runner.spec_decode.config import SpeculativeConfig
from engine.runner.spec_decode.draft_model import DraftModelProposer
from engine.runner.spec_decode.ngram_proposer import NgramProposer
from engine.runner.spec_decode.verification import can_speculate, logprobs_of_tokens, verify_drafts
from engine.runner.structured_output.logits_mask import mask_draft_positions


class SpeculativeStep:
    def __init__(self, config: SpeculativeConfig, vocab_size: int,
                 draft_model: DraftModelProposer | None = None) -> None:
        self.config = config
        self.vocab_size = vocab_size
        self.proposer = NgramProposer(config.num_speculative_tokens, config.prompt_lookup_min,
                                      config.prompt_lookup_max)
        # The draft model's proposer (method draft_model); None: n-gram drafts.
        self.draft_model = draft_model

    @staticmethod
    def write_drafts(batch: InputBatch, scheduled_drafts: Mapping[str, list[int]]) -> dict[int, list[int]]:
        """Put each request's drafts after its known tokens; returns row -> drafts."""
        draft_rows = {}
        for req_id, drafts in scheduled_drafts.items():
            row = batch.req_id_to_index[req_id]
            start = batch.num_tokens[row]
            batch.token_ids_cpu[row, start:start + len(drafts)] = drafts
            draft_rows[row] = drafts
        return draft_rows

    def sample_and_verify(self, batch: InputBatch, prepared: PreparedInputs, hidden_states: torch.Tensor,
                          compute_logits: Callable[[torch.Tensor], torch.Tensor], draft_rows: dict[int, list[int]],
                          sample_rows: Callable[[np.ndarray, torch.Tensor], tuple[list[int], dict | None]],
                          grammar_backend=None) -> tuple[dict[int, list[int]], dict[str, object]]:
        """Tokens for every sampled row, and the step's logprobs by request id for those that ask: rows
        without drafts through ``sample_rows`` (the ordinary sampler, given the rows and their last-position
        hidden states: their tokens and logprobs), rows with drafts verified (a list of logprobs per request,
        one entry per token). ``grammar_backend``: where some request has a grammar, its drafted positions are
        masked by it first, each by the grammar's state after the drafts before it, as vLLM verifies them."""
        sampled_rows = prepared.sampled_rows
        query_end = prepared.common.query_start_loc[1:]
        plain = np.array([row for row in sampled_rows.tolist() if row not in draft_rows], dtype=np.int64)
        tokens: dict[int, list[int]] = {}
        logprobs: dict[str, object] = {}
        if len(plain):
            indices = torch.from_numpy(query_end[plain].astype(np.int64) - 1).to(hidden_states.device)
            plain_tokens, plain_logprobs = sample_rows(plain, hidden_states[indices])
            for row, token in zip(plain.tolist(), plain_tokens):
                tokens[row] = [token]
            logprobs.update(plain_logprobs or {})
        rows = sorted(draft_rows)
        # Each drafted row's last len(drafts) + 1 positions: after its last known token, then after each draft.
        positions = np.concatenate([np.arange(query_end[row] - len(draft_rows[row]) - 1, query_end[row])
                                    for row in rows]).astype(np.int64)
        logits = compute_logits(hidden_states[torch.from_numpy(positions).to(hidden_states.device)])
        states = [batch.request_states[row] for row in rows]
        drafts = [draft_rows[row] for row in rows]
        if grammar_backend is not None:
            mask_draft_positions(logits, states, drafts, grammar_backend)
        verified = verify_drafts(logits, states, drafts, self.vocab_size)
        for state, row_tokens in zip(states, verified):
            if state.grammar is not None:
                for token in row_tokens:
                    state.grammar.accept(token)
        for row, row_tokens in zip(rows, verified):
            tokens[row] = row_tokens
        for state, entries in zip(states, logprobs_of_tokens(logits, states, drafts, verified)):
            if entries is not None:
                logprobs[state.req_id] = entries
        return tokens, logprobs

    def propose(self, batch: InputBatch, rows: list[int], prepared: PreparedInputs | None = None,
                metadata_builder=None, hidden_states: torch.Tensor | None = None) -> dict[str, list[int]]:
        """Drafts for each of ``rows`` (requests that just sampled) whose sampling allows speculation. A draft model
        also catches up on every row's newly known tokens (``prepared``: the step's inputs), drafting or not; an
        EAGLE head does so from the target's ``hidden_states`` of the step."""
        speculating = [row for row in rows if can_speculate(batch.request_states[row].sampling_params,
                                                            len(batch.request_states[row].output_token_ids))]
        if self.draft_model is not None:
            # Known after this step: a sampled row's every token, another row's computed chunk.
            known_ends = prepared.common.seq_lens.astype(np.int64)
            known_ends[rows] = batch.num_tokens[rows]
            drafts = self.draft_model.propose(batch, known_ends, speculating, metadata_builder, hidden_states,
                                              prepared)
        else:
            drafts = {row: self.proposer.propose(batch.token_ids_cpu[row, :batch.num_tokens[row]])
                      for row in speculating}
        proposals = {}
        for row, row_drafts in drafts.items():
            grammar = batch.request_states[row].grammar
            if grammar is not None:  # only what the grammar allows is worth verifying
                row_drafts = row_drafts[:grammar.valid_draft_prefix(row_drafts)]
            if row_drafts:
                proposals[batch.req_ids[row]] = row_drafts
        return proposals
