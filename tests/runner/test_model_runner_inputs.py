"""The persistent input batch and the vectorized input preparation, against direct definitions.

A hypothesis state machine adds, removes and condenses requests at random and checks the batch's
invariants after every operation; prepare_inputs is compared with the reference construction
(``build_attention_metadata`` / ``compute_positions``) on random batches.
"""

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from engine.core.sampling_params import SamplingParams
from engine.runner.attention import build_attention_metadata, compute_positions
from engine.runner.attention_builders import get_metadata_builder
from engine.runner.block_table import BlockTable
from engine.runner.input_batch import InputBatch
from engine.runner.prepare_inputs import prepare_inputs
from engine.runner.request_state import CachedRequestState

BLOCK_SIZE = 4
MAX_MODEL_LEN = 64
MAX_REQS = 6


def make_state(req_id, prompt, outputs=(), num_computed=0, block_ids=None):
    num_tokens = len(prompt) + len(outputs)
    if block_ids is None:
        block_ids = list(range(100, 100 + -(-num_tokens // BLOCK_SIZE)))
    return CachedRequestState(req_id, list(prompt), SamplingParams(), None, list(block_ids), num_computed,
                              list(outputs))


class InputBatchMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.batch = InputBatch(MAX_REQS, MAX_MODEL_LEN, MAX_MODEL_LEN // BLOCK_SIZE, BLOCK_SIZE)
        self.live: dict[str, CachedRequestState] = {}
        self.counter = 0
        self.condensed = True

    @precondition(lambda self: len(self.live) < MAX_REQS)
    @rule(prompt_len=st.integers(1, 30), num_outputs=st.integers(0, 5), data=st.data())
    def add(self, prompt_len, num_outputs, data):
        self.counter += 1
        req_id = f"r{self.counter}"
        prompt = data.draw(st.lists(st.integers(0, 999), min_size=prompt_len, max_size=prompt_len))
        outputs = data.draw(st.lists(st.integers(0, 999), min_size=num_outputs, max_size=num_outputs))
        num_blocks = -(-(prompt_len + num_outputs) // BLOCK_SIZE)
        state = make_state(req_id, prompt, outputs, data.draw(st.integers(0, prompt_len)),
                           [self.counter * 100 + i for i in range(num_blocks)])
        self.batch.add_request(state)
        self.live[req_id] = state

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def remove(self, data):
        req_id = data.draw(st.sampled_from(sorted(self.live)))
        assert self.batch.remove_request(req_id) is not None
        del self.live[req_id]
        self.condensed = False

    @rule()
    def condense(self):
        self.batch.condense()
        self.condensed = True

    @precondition(lambda self: self.live and self.condensed)
    @rule(data=st.data())
    def append_tokens(self, data):
        rows = np.array(sorted(data.draw(st.sets(st.integers(0, len(self.live) - 1), min_size=1))))
        tokens = np.array([data.draw(st.integers(0, 999)) for _ in rows], dtype=np.int32)
        for row, token in zip(rows.tolist(), tokens.tolist()):
            state = self.batch.request_states[row]
            if state.num_tokens >= MAX_MODEL_LEN:
                return
        self.batch.append_token_ids(rows, tokens)
        for row, token in zip(rows.tolist(), tokens.tolist()):
            self.batch.request_states[row].output_token_ids.append(token)

    @invariant()
    def rows_mirror_states(self):
        batch = self.batch
        assert batch.num_reqs == len(self.live)
        for req_id, row in batch.req_id_to_index.items():
            state = self.live[req_id]
            assert batch.request_states[row] is state and batch.req_ids[row] == req_id
            tokens = state.prompt_token_ids + state.output_token_ids
            assert batch.num_tokens[row] == len(tokens)
            assert batch.token_ids_cpu[row, :len(tokens)].tolist() == tokens
            assert batch.num_prompt_tokens[row] == len(state.prompt_token_ids)
            assert batch.block_table.row_block_ids(row) == state.block_ids
            assert not batch.block_table.block_table[row, len(state.block_ids):].any()
        if self.condensed:
            assert sorted(batch.req_id_to_index.values()) == list(range(len(self.live)))
            assert None not in batch.req_ids


TestInputBatch = InputBatchMachine.TestCase
TestInputBatch.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 40), st.integers(1, 20), st.integers(0, 3)), min_size=1, max_size=6),
       st.randoms(use_true_random=False))
def test_prepare_inputs_matches_reference(shapes, rng):
    """shapes: (num_computed, num_scheduled, extra known tokens past the chunk) per request."""
    batch = InputBatch(8, 128, 128 // BLOCK_SIZE, BLOCK_SIZE)
    free_blocks = list(range(1, 200))
    rng.shuffle(free_blocks)
    block_ids, all_tokens = [], []
    for index, (computed, scheduled, extra) in enumerate(shapes):
        num_tokens = computed + scheduled + extra
        tokens = [rng.randrange(1000) for _ in range(num_tokens)]
        blocks = [free_blocks.pop() for _ in range(-(-(computed + scheduled) // BLOCK_SIZE))]
        batch.add_request(make_state(f"r{index}", tokens[:max(1, computed)], tokens[max(1, computed):], computed,
                                     blocks))
        block_ids.append(blocks)
        all_tokens.append(tokens)
    computed = [c for c, _, _ in shapes]
    scheduled = [s for _, s, _ in shapes]
    prepared = prepare_inputs(batch, np.array(scheduled, dtype=np.int32))
    reference = build_attention_metadata(computed, scheduled, block_ids, BLOCK_SIZE)

    assert prepared.positions.tolist() == compute_positions(computed, scheduled).tolist()
    assert prepared.common.slot_mapping.tolist() == reference.slot_mapping.tolist()
    assert prepared.common.query_start_loc.tolist() == reference.query_start_loc_cpu
    assert prepared.common.seq_lens.tolist() == reference.seq_lens_cpu
    assert prepared.input_ids.tolist() == [t for tokens, c, s in zip(all_tokens, computed, scheduled)
                                           for t in tokens[c:c + s]]
    # Only rows whose chunk reaches their last known token are sampled, at their last scheduled token.
    sampled = [i for i, (_, _, extra) in enumerate(shapes) if extra == 0]
    assert prepared.sampled_rows.tolist() == sampled
    assert prepared.logits_indices.tolist() == [reference.query_start_loc_cpu[i + 1] - 1 for i in sampled]

    built = get_metadata_builder("torch", torch.device("cpu")).build(prepared.common)
    assert torch.equal(built.slot_mapping, reference.slot_mapping)
    assert built.block_table.shape[1] >= max(len(b) for b in block_ids)
    assert torch.equal(built.block_table[:, :reference.block_table.shape[1]], reference.block_table)
    flash = get_metadata_builder("flash_attn", torch.device("cpu")).build(prepared.common)
    assert flash.seq_start_loc.tolist() == [0] + np.cumsum(reference.seq_lens_cpu).tolist()


def test_block_table_rows():
    table = BlockTable(3, 4, BLOCK_SIZE)
    table.add_row([5, 6], 0)
    table.append_row([7], 0)
    table.add_row([9], 2)
    assert table.row_block_ids(0) == [5, 6, 7]
    table.move_row(2, 0)
    assert table.row_block_ids(0) == [9] and table.block_table[0].tolist() == [9, 0, 0, 0]
    assert table.row_block_ids(2) == [] and not table.block_table[2].any()
    slots = table.compute_slot_mapping(np.array([0, 0]), np.array([0, 3]))
    assert slots.tolist() == [9 * BLOCK_SIZE, 9 * BLOCK_SIZE + 3]
    try:
        table.append_row([1, 2, 3, 4], 0)
    except ValueError as error:
        assert "max_model_len" in str(error)
    else:
        raise AssertionError("a row longer than the table must be refused")
