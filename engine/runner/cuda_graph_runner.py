"""CUDA graphs for decode-only steps: capture a forward once per padded batch size, then replay it.

A decode step of a small model is dominated by kernel-launch overhead (a few hundred launches of a
few microseconds each); replaying a captured graph issues them all at once. A graph replays exactly
the kernels and *addresses* it captured, so inputs must live in static buffers that each step
overwrites, and the batch must be padded up to a captured size.

Contract the model runner follows to use ``DecodeCudaGraphRunner``:

1. Decode-only steps: every request has exactly one query token, so num_tokens == num_reqs == the
   batch size. Any step with a prefill chunk runs eagerly (``run`` falls back by itself when the batch
   is larger than the largest captured size or the runner is disabled).
2. ``model_forward_fn(inputs)`` receives a dict of tensors that are views of the static buffers, sliced
   to the padded batch size, and returns one tensor (e.g. logits or hidden states) whose first
   dimension is the padded batch. It may read other tensors only if they never move (parameters, the
   KV caches allocated once). It must not sync with the host: no ``.item()``, ``.tolist()``, boolean
   indexing or printing of device values (all illegal during capture).
3. Attention metadata is built inside ``model_forward_fn`` from these views only: device tensors of a
   fixed shape for the padded batch. Host-side fields must not vary between steps: ``max_query_len``
   = 1, ``num_actual_tokens`` = the padded size, ``max_seq_len`` = the model's maximum length (an upper
   bound is what a replay needs), and the ``*_cpu`` lists may be placeholders. The 'triton' attention
   backend reads device tensors only and is capture-safe; the 'torch' backend is not (it reads the
   host lists and compacts with boolean masks).
4. Padding rules (``decode_input_specs`` encodes them), for rows ``[batch, padded)``:
   ``slot_mapping = -1`` (nothing is written to the cache), ``seq_lens = 0``, ``block_table`` rows 0,
   ``query_start_loc[i] = batch`` (the padded requests own no query tokens, so attention skips them),
   ``input_ids = 0`` and ``positions = 0`` (any valid id/position: the rows are computed and dropped).
5. Sampling and everything that reads results on the host happens after ``run`` returns. The returned
   tensor is a view of the graph's static output: it is overwritten by the next replay, so consume or
   clone it first.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch

ForwardFn = Callable[[dict[str, torch.Tensor]], torch.Tensor]


@dataclass(frozen=True)
class StaticInput:
    """One static input buffer: ``[rows, *trailing_shape]`` where rows = batch + ``extra_rows``.

    Rows past the real batch are filled with ``pad_value``, or, with ``pad_with_last``, with the last
    real row (used by ``query_start_loc``, whose padded entries repeat the total token count).
    """

    name: str
    dtype: torch.dtype
    trailing_shape: tuple[int, ...] = ()
    pad_value: int | float = 0
    extra_rows: int = 0
    pad_with_last: bool = False


def decode_input_specs(max_num_blocks_per_req: int, *, input_ids_dtype: torch.dtype = torch.long,
                       slot_mapping_dtype: torch.dtype = torch.long, num_kv_cache_groups: int = 1) -> list[StaticInput]:
    """The inputs of a decode step with the padding rules of the module docstring; a hybrid KV cache's groups
    past the first add their own slot mapping and block table (``slot_mapping_1``, ``block_table_1``, ...)."""
    base = [
        StaticInput("input_ids", input_ids_dtype, pad_value=0),
        StaticInput("positions", torch.long, pad_value=0),
        StaticInput("slot_mapping", slot_mapping_dtype, pad_value=-1),
        StaticInput("seq_lens", torch.int32, pad_value=0),
        StaticInput("query_start_loc", torch.int32, extra_rows=1, pad_with_last=True),
        StaticInput("block_table", torch.int32, trailing_shape=(max_num_blocks_per_req,), pad_value=0),
    ]
    return base + [spec for group in range(1, num_kv_cache_groups) for spec in (
        StaticInput(f"slot_mapping_{group}", slot_mapping_dtype, pad_value=-1),
        StaticInput(f"block_table_{group}", torch.int32, trailing_shape=(max_num_blocks_per_req,), pad_value=0))]


def default_batch_size_ladder(max_batch_size: int) -> list[int]:
    """1, 2, 4, 8, ... below ``max_batch_size``, then ``max_batch_size`` itself.

    Powers of two bound the padding waste by 2x with log2(max) graphs; each graph costs capture time
    and a little memory, so the ladder stays short.
    """
    if max_batch_size < 1:
        raise ValueError(f"max_batch_size must be at least 1, got {max_batch_size}")
    ladder, size = [], 1
    while size < max_batch_size:
        ladder.append(size)
        size *= 2
    return ladder + [max_batch_size]


def normalize_ladder(batch_size_ladder: Sequence[int] | None, max_batch_size: int) -> list[int]:
    """Sorted, deduplicated sizes in [1, max_batch_size]; raises on a size outside that range."""
    if batch_size_ladder is None:
        return default_batch_size_ladder(max_batch_size)
    sizes = sorted(set(int(size) for size in batch_size_ladder))
    if not sizes or sizes[0] < 1 or sizes[-1] > max_batch_size:
        raise ValueError(f"batch_size_ladder must hold sizes in [1, {max_batch_size}], got {list(batch_size_ladder)}")
    return sizes


def padded_batch_size(batch_size: int, ladder: Sequence[int]) -> int | None:
    """The smallest captured size >= ``batch_size``; None when the batch is larger than all of them."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")
    for size in ladder:  # short and sorted: a linear scan is clearer than bisect
        if size >= batch_size:
            return size
    return None


def pad_into(buffer: torch.Tensor, values: torch.Tensor, spec: StaticInput, batch_size: int, padded: int) -> None:
    """Copy ``values`` (rows for ``batch_size``) into ``buffer[:padded + extra_rows]`` and fill the padding."""
    rows = batch_size + spec.extra_rows
    total = padded + spec.extra_rows
    if values.shape[0] != rows or tuple(values.shape[1:]) != tuple(buffer.shape[1:]):
        raise ValueError(f"input {spec.name!r} has shape {tuple(values.shape)}, expected "
                         f"{(rows, *buffer.shape[1:])} for batch size {batch_size}")
    buffer[:rows].copy_(values, non_blocking=True)
    if total > rows:
        if spec.pad_with_last:
            buffer[rows:total].copy_(buffer[rows - 1:rows].expand(total - rows, *buffer.shape[1:]))
        else:
            buffer[rows:total].fill_(spec.pad_value)


class DecodeCudaGraphRunner:
    """Captures ``model_forward_fn`` for each size of a batch-size ladder and replays the smallest fit.

    ``enabled=False`` (or a machine without CUDA, or a batch above the largest size) runs the forward
    eagerly on the unpadded inputs, so callers need a single code path.

    ``emulate=True`` keeps everything a replay does except the graph: static buffers on ``device`` (the
    CPU too), padding up the ladder, the forward on the padded views, the output sliced back. It is how
    the padding contract is tested where no GPU is, and a way to tell a graph problem from a padding
    problem on one.
    """

    def __init__(self, model_forward_fn: ForwardFn, max_batch_size: int, input_specs: Sequence[StaticInput],
                 batch_size_ladder: Sequence[int] | None = None, *, enabled: bool = True,
                 device: torch.device | str = "cuda", num_warmup_runs: int = 2, emulate: bool = False) -> None:
        self.model_forward_fn = model_forward_fn
        self.ladder = normalize_ladder(batch_size_ladder, max_batch_size)
        self.input_specs = {spec.name: spec for spec in input_specs}
        self.device = torch.device(device)
        self.emulate = emulate and enabled
        self.enabled = self.emulate or (enabled and self.device.type == "cuda" and torch.cuda.is_available())
        self.num_warmup_runs = num_warmup_runs
        self._buffers: dict[str, torch.Tensor] = {}
        self._graphs: dict[int, torch.cuda.CUDAGraph | None] = {}  # None: emulated
        self._outputs: dict[int, torch.Tensor] = {}

    @property
    def captured_sizes(self) -> list[int]:
        return sorted(self._graphs)

    def capture(self) -> None:
        """Capture every ladder size, largest first so the smaller graphs reuse its memory pool."""
        if not self.enabled:
            return
        largest = self.ladder[-1]
        self._buffers = {
            name: torch.full((largest + spec.extra_rows, *spec.trailing_shape), spec.pad_value, dtype=spec.dtype,
                             device=self.device)
            for name, spec in self.input_specs.items()
        }
        if self.emulate:
            self._graphs = {size: None for size in self.ladder}
            return
        # The buffers start as all padding (slot -1, no query tokens, seq_len 0): the warm-up runs execute
        # for real and must write nothing to the KV cache.
        pool = None
        for size in reversed(self.ladder):
            inputs = self._views(size)
            stream = torch.cuda.Stream(self.device)
            stream.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(stream):  # warm-up off the default stream, as capture requires
                for _ in range(self.num_warmup_runs):
                    self.model_forward_fn(inputs)
            torch.cuda.current_stream(self.device).wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                output = self.model_forward_fn(inputs)
            pool = graph.pool() if pool is None else pool
            self._graphs[size], self._outputs[size] = graph, output
        torch.cuda.synchronize(self.device)

    def run(self, batch_size: int, inputs: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """The forward's output for the first ``batch_size`` rows (a view of a static buffer on replay)."""
        padded = padded_batch_size(batch_size, self.ladder) if self._graphs else None
        if padded is None:
            return self.model_forward_fn(dict(inputs))
        missing = sorted(set(self.input_specs) - set(inputs))
        if missing:
            raise KeyError(f"inputs {missing} are missing; the captured graphs read {sorted(self.input_specs)}")
        for name, spec in self.input_specs.items():
            pad_into(self._buffers[name], inputs[name], spec, batch_size, padded)
        if self.emulate:
            return self.model_forward_fn(self._views(padded))[:batch_size]
        self._graphs[padded].replay()
        return self._outputs[padded][:batch_size]

    def _views(self, size: int) -> dict[str, torch.Tensor]:
        return {name: self._buffers[name][:size + spec.extra_rows] for name, spec in self.input_specs.items()}
