"""The persistent block table: one row of physical block ids per row of the input batch.

Kept as a numpy array on the host so that the per-step work is a few vectorized operations, never a
Python loop over tokens (the seed's ``block_table.compute_slot_mapping()``):

    slot of position p of row r = block_table[r, p // block_size] * block_size + p % block_size

Invariants: ``num_blocks_per_row[r]`` entries of row r are valid; entries past them are 0 (the null
block, which the scheduler never hands out), so a stray read lands on a block no request owns.
"""

from __future__ import annotations

import numpy as np


class BlockTable:
    def __init__(self, max_num_reqs: int, max_num_blocks_per_req: int, block_size: int) -> None:
        self.max_num_reqs = max_num_reqs
        self.max_num_blocks_per_req = max_num_blocks_per_req
        self.block_size = block_size
        self.block_table = np.zeros((max_num_reqs, max_num_blocks_per_req), dtype=np.int32)
        self.num_blocks_per_row = np.zeros(max_num_reqs, dtype=np.int32)

    def add_row(self, block_ids: list[int], row: int) -> None:
        """Replace row ``row`` with ``block_ids`` (a new request, or one resumed after preemption)."""
        num_blocks = len(block_ids)
        self._check_room(row, num_blocks)
        self.block_table[row, :num_blocks] = block_ids
        self.block_table[row, num_blocks:self.num_blocks_per_row[row]] = 0
        self.num_blocks_per_row[row] = num_blocks

    def append_row(self, block_ids: list[int], row: int) -> None:
        """Extend row ``row`` with the blocks the scheduler allocated in this step."""
        start = int(self.num_blocks_per_row[row])
        end = start + len(block_ids)
        self._check_room(row, end)
        self.block_table[row, start:end] = block_ids
        self.num_blocks_per_row[row] = end

    def move_row(self, source: int, target: int) -> None:
        """Copy row ``source`` into row ``target`` (condensing the batch); ``source`` becomes empty."""
        num_blocks = int(self.num_blocks_per_row[source])
        self.block_table[target, :num_blocks] = self.block_table[source, :num_blocks]
        self.block_table[target, num_blocks:self.num_blocks_per_row[target]] = 0
        self.num_blocks_per_row[target] = num_blocks
        self.clear_row(source)

    def clear_row(self, row: int) -> None:
        self.block_table[row, :self.num_blocks_per_row[row]] = 0
        self.num_blocks_per_row[row] = 0

    def compute_slot_mapping(self, req_indices: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """Slots [num_tokens] int64 of tokens at ``positions`` of batch rows ``req_indices``."""
        block_size = self.block_size
        block_numbers = self.block_table[req_indices, positions // block_size].astype(np.int64)
        return block_numbers * block_size + positions % block_size

    def row_block_ids(self, row: int) -> list[int]:
        return self.block_table[row, :self.num_blocks_per_row[row]].tolist()

    def _check_room(self, row: int, num_blocks: int) -> None:
        if num_blocks > self.max_num_blocks_per_req:
            raise ValueError(f"row {row} needs {num_blocks} blocks, the table holds at most "
                             f"{self.max_num_blocks_per_req} per request (max_model_len / block_size)")


class MultiGroupBlockTable:
    """One ``BlockTable`` per group of a hybrid KV cache (engine/core/hybrid_kv_cache_manager.py), kept in step:
    every row operation applies to every group, with each group's own block ids (the scheduler sends one list
    per group). ``block_table`` and ``block_size`` are group 0's, for readers of a single table."""

    def __init__(self, num_groups: int, max_num_reqs: int, max_num_blocks_per_req: int, block_size: int) -> None:
        self.tables = [BlockTable(max_num_reqs, max_num_blocks_per_req, block_size) for _ in range(num_groups)]
        self.block_size = block_size
        self.block_table = self.tables[0].block_table
        self.num_blocks_per_row = self.tables[0].num_blocks_per_row

    def add_row(self, block_ids: tuple[list[int], ...], row: int) -> None:
        for table, ids in zip(self.tables, block_ids, strict=True):
            table.add_row(ids, row)

    def append_row(self, block_ids: tuple[list[int], ...], row: int) -> None:
        for table, ids in zip(self.tables, block_ids, strict=True):
            if ids:
                table.append_row(ids, row)

    def move_row(self, source: int, target: int) -> None:
        for table in self.tables:
            table.move_row(source, target)

    def clear_row(self, row: int) -> None:
        for table in self.tables:
            table.clear_row(row)

    def compute_slot_mapping(self, req_indices: np.ndarray, positions: np.ndarray) -> np.ndarray:
        return self.tables[0].compute_slot_mapping(req_indices, positions)

    def row_block_ids(self, row: int) -> tuple[list[int], ...]:
        return tuple(table.row_block_ids(row) for table in self.tables)
