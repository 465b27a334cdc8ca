"""Decode requests grouped by context length, so a padded batched gather wastes little.

The torch backend attends all decodes of a group with one gather of their blocks and one SDPA call,
padding every request to the group's longest context. Padding everything to the batch's longest
context (a batch mixing 50- and 800-token contexts) would gather and attend mostly padding: sorting by
length and cutting a new group whenever a request is shorter than ``MIN_FILL`` of the group's longest
keeps the padded fraction under ``1 - MIN_FILL`` while calls per layer stay few.

A group is also cut when its gathered keys and values would outgrow ``max_group_tokens`` (padded
tokens): measured on a CPU with a 32 MiB last-level cache, decode steps whose groups gathered ~26,000
tokens of K and V at once (dozens of requests over a shared 512-token prefix, all of one length) took
up to 70% longer than steps reading the same number of KV tokens in smaller groups, because the gathered
copy no longer stays in cache until attention reads it. Smaller groups cost a few more calls per layer
and keep a step's time proportional to the KV it reads.

Computed once per step (and block size) from host lists, then shared by every layer.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# A request joins the current group if it needs at least this fraction of the group's blocks, or at
# most one block fewer (short contexts would otherwise split into many tiny groups).
MIN_FILL = 0.8


@dataclass
class DecodeGroup:
    req_indices: torch.Tensor  # [n] int64: the requests' rows in the batch
    token_indices: torch.Tensor  # [n] int64: the row of each request's query token
    block_ids: torch.Tensor  # [n * num_blocks] int64: each request's blocks from its window's first, flattened
    num_blocks: int
    attn_mask: torch.Tensor  # [n, 1, 1, num_blocks * block_size] bool: True = a key the request attends
    # Flat indices into the gathered [n * num_blocks * block_size] keys the mask hides (past a request's
    # length, or before its window): zeroed after the gather, because a masked position still multiplies
    # its (maybe NaN) value.
    padding_indices: torch.Tensor

    @property
    def num_reqs(self) -> int:
        return self.req_indices.shape[0]


def make_decode_groups(decode_req_indices: list[int], seq_lens_cpu: list[int], query_start_loc_cpu: list[int],
                       block_table: torch.Tensor, block_size: int,
                       max_group_tokens: int | None = None, sliding_window: int | None = None) -> list[DecodeGroup]:
    """Groups of decodes in descending span, the blocks each must gather; ``max_group_tokens`` caps a
    group's padded tokens (a group always takes at least one request).

    With a ``sliding_window`` a decode at position ``seq_len - 1`` reads keys from ``seq_len - sliding_window``
    on, so its span starts at that key's block: the blocks before it are never gathered (the core may have
    freed them), and a long request costs what its window costs."""
    first_keys = {req: window_start(seq_lens_cpu[req], sliding_window) for req in decode_req_indices}
    spans = {req: -(-seq_lens_cpu[req] // block_size) - first_keys[req] // block_size for req in decode_req_indices}
    order = sorted(decode_req_indices, key=lambda req: spans[req], reverse=True)
    groups: list[list[int]] = []
    group_blocks = 0
    for req in order:
        num_blocks = spans[req]
        fits = bool(groups) and (max_group_tokens is None
                                 or (len(groups[-1]) + 1) * group_blocks * block_size <= max_group_tokens)
        if fits and (num_blocks >= MIN_FILL * group_blocks or num_blocks >= group_blocks - 1):
            groups[-1].append(req)
        else:
            groups.append([req])
            group_blocks = num_blocks
    return [_make_group(reqs, seq_lens_cpu, first_keys, spans[reqs[0]], query_start_loc_cpu, block_table, block_size)
            for reqs in groups]


def window_start(seq_len: int, sliding_window: int | None) -> int:
    """The first key a decode at position ``seq_len - 1`` attends: 0 without a window."""
    return 0 if sliding_window is None else max(0, seq_len - sliding_window)


def _make_group(reqs: list[int], seq_lens_cpu: list[int], first_keys: dict[int, int], num_blocks: int,
                query_start_loc_cpu: list[int], block_table: torch.Tensor, block_size: int) -> DecodeGroup:
    device = block_table.device
    max_len = num_blocks * block_size
    req_indices = torch.tensor(reqs, dtype=torch.long, device=device)
    seq_lens = torch.tensor([seq_lens_cpu[req] for req in reqs], dtype=torch.long, device=device)
    first_blocks = torch.tensor([first_keys[req] // block_size for req in reqs], dtype=torch.long, device=device)
    first_keys_tensor = torch.tensor([first_keys[req] for req in reqs], dtype=torch.long, device=device)
    # Gathered slot j of a request holds its key at absolute position first_block * block_size + j.
    positions = first_blocks[:, None] * block_size + torch.arange(max_len, device=device)[None, :]  # [n, max_len]
    valid = (positions < seq_lens[:, None]) & (positions >= first_keys_tensor[:, None])
    # A shorter request of the group pads with entries past its own blocks; clamped to the table's width,
    # they name some block whose slots the mask and the zeroing below neutralize.
    columns = (first_blocks[:, None] + torch.arange(num_blocks, device=device)[None, :]).clamp(max=block_table.shape[1] - 1)
    return DecodeGroup(
        req_indices=req_indices,
        token_indices=torch.tensor([query_start_loc_cpu[req] for req in reqs], dtype=torch.long, device=device),
        block_ids=block_table[req_indices[:, None], columns].to(torch.long).reshape(-1),
        num_blocks=num_blocks,
        attn_mask=valid[:, None, None, :],
        padding_indices=torch.nonzero(~valid.reshape(-1)).reshape(-1),
    )
