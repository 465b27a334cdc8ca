"""The persistent input batch: per-row arrays that survive from step to step (the seed's 5.1.1).

Rebuilding every request's tokens and block table each step would cost O(total tokens) of Python per
step; instead each request owns a row, and a step only changes what changed: new requests are
written into free rows, finished ones leave holes, and ``condense()`` moves the last rows into the
holes so that rows ``0 .. num_reqs - 1`` are exactly the live requests.

Invariants after ``condense()``:
- ``req_ids[row]`` is the request in ``row`` and ``req_id_to_index`` is its inverse; no holes.
- ``token_ids_cpu[row, :num_tokens[row]]`` are the request's prompt then output tokens.
- ``num_computed_tokens_cpu[row]`` tokens of the row have KV in the cache (before this step's tokens).
- ``block_table`` row ``row`` holds the request's physical blocks, in logical order.
- ``lora_int_ids[row]`` is the request's LoRA adapter id, 0 for the base model (engine/runner/lora/).
"""

from __future__ import annotations

import heapq

import numpy as np

from engine.runner.block_table import BlockTable, MultiGroupBlockTable
from engine.runner.request_state import CachedRequestState


class InputBatch:
    def __init__(self, max_num_reqs: int, max_model_len: int, max_num_blocks_per_req: int,
                 block_size: int) -> None:
        self.max_num_reqs = max_num_reqs
        self.max_model_len = max_model_len
        self._req_ids: list[str | None] = []
        self.req_id_to_index: dict[str, int] = {}
        self.request_states: list[CachedRequestState | None] = []
        # Rows freed since the last condense(), smallest first: new requests fill them first.
        self._holes: list[int] = []
        # One column past max_model_len: a request whose prompt fills max_model_len still samples one token
        # (as in vLLM, a prompt may be max_model_len long), and the runner appends it before the scheduler's
        # length check finishes the request. That token is never fed back, so it needs no KV slot.
        self.token_ids_cpu = np.zeros((max_num_reqs, max_model_len + 1), dtype=np.int32)
        self.num_tokens = np.zeros(max_num_reqs, dtype=np.int32)
        self.num_prompt_tokens = np.zeros(max_num_reqs, dtype=np.int32)
        self.num_computed_tokens_cpu = np.zeros(max_num_reqs, dtype=np.int32)
        self.lora_int_ids = np.zeros(max_num_reqs, dtype=np.int32)
        self.block_table: BlockTable | MultiGroupBlockTable = BlockTable(max_num_reqs, max_num_blocks_per_req,
                                                                         block_size)

    def use_block_table_per_group(self, num_groups: int) -> None:
        """One block table per group of a hybrid KV cache (before any request joins)."""
        if self.req_id_to_index:
            raise RuntimeError("the block tables change only while the batch is empty")
        table = self.block_table
        self.block_table = MultiGroupBlockTable(num_groups, table.max_num_reqs, table.max_num_blocks_per_req,
                                                table.block_size)

    # ------------------------------------------------------------------ membership

    @property
    def num_reqs(self) -> int:
        return len(self.req_id_to_index)

    @property
    def req_ids(self) -> list[str]:
        """Live request ids in row order (valid once condensed)."""
        return self._req_ids  # type: ignore[return-value]

    def __contains__(self, req_id: str) -> bool:
        return req_id in self.req_id_to_index

    def add_request(self, state: CachedRequestState) -> int:
        """Write the request into the smallest free row and return that row."""
        if state.req_id in self.req_id_to_index:
            raise ValueError(f"request {state.req_id!r} is already in the input batch")
        if self._holes:
            row = heapq.heappop(self._holes)
        else:
            row = len(self._req_ids)
            if row >= self.max_num_reqs:
                raise ValueError(f"the input batch is full ({self.max_num_reqs} rows = max_num_seqs)")
            self._req_ids.append(None)
            self.request_states.append(None)
        num_prompt_tokens = len(state.prompt_token_ids)
        num_tokens = num_prompt_tokens + len(state.output_token_ids)
        if num_tokens > self.max_model_len:
            raise ValueError(f"request {state.req_id!r} has {num_tokens} tokens, more than max_model_len "
                             f"{self.max_model_len}")
        self._req_ids[row] = state.req_id
        self.req_id_to_index[state.req_id] = row
        self.request_states[row] = state
        tokens = self.token_ids_cpu[row]
        tokens[:num_prompt_tokens] = state.prompt_token_ids
        tokens[num_prompt_tokens:num_tokens] = state.output_token_ids
        self.num_tokens[row] = num_tokens
        self.num_prompt_tokens[row] = num_prompt_tokens
        self.num_computed_tokens_cpu[row] = state.num_computed_tokens
        self.lora_int_ids[row] = 0 if state.lora_request is None else state.lora_request.lora_int_id
        self.block_table.add_row(state.block_ids, row)
        return row

    def remove_request(self, req_id: str) -> int | None:
        """Free the request's row (a hole until condense()); None if it was not in the batch."""
        row = self.req_id_to_index.pop(req_id, None)
        if row is None:
            return None
        self._req_ids[row] = None
        self.request_states[row] = None
        self.block_table.clear_row(row)
        heapq.heappush(self._holes, row)
        return row

    def condense(self) -> None:
        """Move the last live rows into the holes so that rows 0 .. num_reqs - 1 are all live."""
        holes = self._holes
        if not holes:
            return
        req_ids = self._req_ids
        num_reqs = self.num_reqs
        # Holes at or past the new end simply disappear; the rest are filled from the end.
        targets = sorted(row for row in holes if row < num_reqs)
        source = len(req_ids) - 1
        for target in targets:
            while req_ids[source] is None:
                source -= 1
            self._move_row(source, target)
            source -= 1
        del req_ids[num_reqs:]
        del self.request_states[num_reqs:]
        holes.clear()

    def _move_row(self, source: int, target: int) -> None:
        req_id = self._req_ids[source]
        self._req_ids[target], self._req_ids[source] = req_id, None
        self.request_states[target], self.request_states[source] = self.request_states[source], None
        self.req_id_to_index[req_id] = target
        num_tokens = self.num_tokens[source]
        self.token_ids_cpu[target, :num_tokens] = self.token_ids_cpu[source, :num_tokens]
        self.num_tokens[target] = num_tokens
        self.num_prompt_tokens[target] = self.num_prompt_tokens[source]
        self.num_computed_tokens_cpu[target] = self.num_computed_tokens_cpu[source]
        self.lora_int_ids[target] = self.lora_int_ids[source]
        self.block_table.move_row(source, target)

    # ------------------------------------------------------------------ per-step updates

    def append_token_ids(self, rows: np.ndarray, token_ids: np.ndarray) -> None:
        """Append one sampled token to each of ``rows`` (vectorized over the batch)."""
        self.token_ids_cpu[rows, self.num_tokens[rows]] = token_ids
        self.num_tokens[rows] += 1

    def append_row_token_ids(self, row: int, token_ids: list[int]) -> None:
        """Append several tokens to one row (a step that kept drafts)."""
        start = self.num_tokens[row]
        self.token_ids_cpu[row, start:start + len(token_ids)] = token_ids
        self.num_tokens[row] = start + len(token_ids)

    def truncate_output(self, row: int, num_output_tokens: int) -> None:
        """Drop tokens the scheduler did not keep (it is the source of truth for a request's length)."""
        self.num_tokens[row] = self.num_prompt_tokens[row] + num_output_tokens
