"""What a cost model is told about one engine step, and the summary figures every model reads.

The simulator's engine loop builds one ``StepBatch`` per step from the scheduler's output and asks the
cost model how long the step takes. Cost models never look at the lists themselves: they read the
``StepFeatures`` that ``step_features`` derives in a single pass. That pass runs once per simulated step,
so it is plain Python over two lists (numpy's call overhead would cost more than it saves for batches
of a few hundred requests).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class StepBatch:
    # one entry per scheduled request, same order in both lists
    num_scheduled_tokens: list[int]   # tokens computed for the request this step (1 for a decode)
    num_computed_tokens: list[int]    # tokens already in the KV cache for the request BEFORE this step (context)
    # KV tokens of shared blocks the batch reads more than once (SchedulerOutput.num_shared_kv_tokens).
    shared_context_tokens: int = 0
    # Runs of consecutive physical KV blocks over the live block tables (SchedulerOutput.num_kv_block_runs).
    kv_block_runs: int = 0
    # Speculative decoding: per request, the draft tokens among its scheduled ones (its scheduled tokens are
    # then its last token and these drafts, verified in one pass). None: no request verifies drafts.
    num_spec_tokens: list[int] | None = None
    # The sliding-window layers' window (SchedulerOutput.sliding_window): a query reads at most this many keys
    # there, so each attention term counts only the keys in its query's window. None: the whole context.
    # ``sliding_window_fraction`` of the layers slide; the others read the whole context, so each attention
    # term is the mean over layers (what a cost linear in it, summed over the layers, needs), rounded.
    sliding_window: int | None = None
    sliding_window_fraction: float = 1.0
    # Chunked local attention (SchedulerOutput.attention_chunk_size): in ``attention_chunk_fraction`` of the
    # layers a query reads only its own chunk's keys. None: no chunked layer.
    attention_chunk_size: int | None = None
    attention_chunk_fraction: float = 1.0
    # Multimodal items encoded in this step (SchedulerOutput.encoder_input_lengths): each item's encoder
    # tokens (the placeholder tokens its output fills). None or empty: the encoder does not run.
    encoder_input_lengths: list[int] | None = None


@dataclass(slots=True)
class StepFeatures:
    num_reqs: int
    num_tokens: int               # total scheduled tokens: rows through every linear layer
    num_prefill_reqs: int         # requests with more than one scheduled token (prompt chunks, recomputation),
                                  # but for verifications of drafts (counted as decodes: see num_spec_tokens)
    num_prefill_tokens: int
    num_decode_reqs: int          # requests with exactly one scheduled token, and verifications of drafts
    decode_context_tokens: int    # sum of (num_computed_tokens + 1) over decodes: KV tokens attention reads
    prefill_context_tokens: int   # sum of num_computed_tokens over prefill chunks: earlier KV the chunks read
    prefill_attention_work: int   # query-key pairs under the causal mask over prefill chunks
    max_seq_len: int              # longest num_computed_tokens + num_scheduled_tokens in the batch
    # Query-key pairs of a chunk's dense score matrix, q * (ctx + q): what an attention kernel that
    # masks a full matrix (the torch backend on a CPU) computes, where a causal kernel skips the
    # masked half (prefill_attention_work). Calibration keeps whichever the measured steps follow.
    prefill_attention_dense_work: int = 0
    # The dense pairs of the chunks that follow a cached context only: kernels that take a causal
    # shortcut for a fresh prompt (the torch backend's is_causal) fall back to an explicit mask, and a
    # full score matrix, once the chunk has context (the torch backend before it sliced its queries).
    # Zero on a step of fresh prompts and decodes.
    context_prefill_dense_work: int = 0
    # Query-key pairs scored when each chunk is attended in slices of PREFILL_QUERY_SLICE query rows,
    # each against the keys up to its own last row (the torch backend on a CPU, which materializes the
    # score matrix and keeps it cache-sized that way). Between the causal and the dense count.
    prefill_attention_sliced_work: int = 0
    # KV tokens read again from blocks that another request of the batch holds too (shared prefixes
    # after prefix-cache hits): a block read many times in a step is read from cache after the first.
    shared_context_tokens: int = 0
    # Runs of consecutive physical block ids over the block tables the step reads: each run starts a
    # gather at a new place in the cache. On a CPU, gathering blocks scattered over the cache took 1.7x
    # as long as gathering the same blocks in order (the prefetcher streams a run), and a long-running
    # engine's free queue is shuffled, so the same batch costs more late in a run than early.
    kv_block_runs: int = 0
    # Speculative decoding's verifications. A request scheduled with its last token and d drafts after c
    # computed tokens is counted as a decode (in num_decode_reqs, and c + d + 1 in decode_context_tokens: it
    # reads its KV once, as a decode does) whose d + 1 query rows go through the linear layers (num_tokens),
    # lm_head and the sampler. num_spec_tokens counts the d draft rows; spec_attention_work the query-key
    # pairs its rows score beyond one per KV token read, d * c + d * (d + 1) / 2 (row i of d + 1 reads c + i
    # keys). Both 0 on a step without drafts, whose features are what they were before speculation existed.
    num_spec_tokens: int = 0
    spec_attention_work: int = 0
    # The verifications themselves: how many requests verify drafts, and the KV tokens they read (their part of
    # decode_context_tokens). A backend that batches query-length-1 decodes but attends a request of several rows
    # on its own (the torch backend on a CPU: per request and layer, its keys gathered apart) pays per
    # verification and per KV token it reads there, not at the batched decodes' rate. Both 0 without drafts.
    num_spec_reqs: int = 0
    spec_context_tokens: int = 0
    # Multi-LoRA serving: tokens of requests that run with an adapter, and the distinct adapters of the batch
    # (sim/lora_steps.py counts them; sim/cost_models/lora_cost.py prices them). Both 0 without LoRA.
    num_lora_tokens: int = 0
    num_active_loras: int = 0
    # Multimodal items encoded before the step's forward (a vision encoder's work; sim/cost_models/
    # vision_encoder_cost.py prices it): their encoder tokens in all, and the sum of each item's tokens squared
    # (its encoder's attention scores every patch against every other of the same image). Both 0 otherwise.
    num_encoder_tokens: int = 0
    encoder_attention_work: int = 0

    @property
    def has_prefill(self) -> int:
        """1 when some request has more than one query token, else 0 (a decode-only step).

        A step-level switch, not a count: an engine that replays CUDA graphs for decode-only steps runs
        every other step eagerly, which costs a fixed launch overhead however few prefill tokens it has.
        """
        return 1 if self.num_prefill_reqs else 0

    @property
    def decode_graph_batch(self) -> int:
        """For a decode-only step, the batch size a CUDA-graph engine replays it at: the smallest power of
        two >= num_reqs (the default capture ladder; padded rows cost like real ones); 0 otherwise."""
        if self.num_prefill_reqs or not self.num_reqs:
            return 0
        return 1 << (self.num_reqs - 1).bit_length()

    def as_dict(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in FEATURE_NAMES}


FEATURE_NAMES: tuple[str, ...] = (*StepFeatures.__slots__, "has_prefill", "decode_graph_batch")

# The torch attention backend's prefill query slice (engine/runner/attention/torch_backend.py, which the
# simulator does not import: it needs torch); a test keeps the two equal.
PREFILL_QUERY_SLICE = 128


def sliced_prefill_pairs(query: int, context: int) -> int:
    """Query-key pairs a chunk of ``query`` tokens after ``context`` cached ones scores in slices of
    PREFILL_QUERY_SLICE rows: the slice ending at row e (1-based) scores its rows against context + e keys."""
    if query <= PREFILL_QUERY_SLICE:
        return query * (context + query)
    num_full, rest = divmod(query, PREFILL_QUERY_SLICE)
    # Full slice i (1-based) ends at row i * S: S * (context + i * S), summed over i = 1..num_full.
    pairs = PREFILL_QUERY_SLICE * (num_full * context + PREFILL_QUERY_SLICE * num_full * (num_full + 1) // 2)
    return pairs + rest * (context + query)


def windowed_keys(first_length: int, count: int, window: int) -> int:
    """Keys read by ``count`` consecutive queries that would see ``first_length``, ``first_length + 1``, ...
    keys without a window, each capped at ``window``: sum of min(k, window) for k in that range."""
    last_length = first_length + count - 1
    if last_length <= window:
        return (first_length + last_length) * count // 2
    if first_length >= window:
        return count * window
    return (first_length + window) * (window - first_length + 1) // 2 + (last_length - window) * window


def windowed_sliced_pairs(query: int, context: int, window: int) -> int:
    """``sliced_prefill_pairs`` under a window: a slice of rows [s, e) scores the keys from its first row's
    window start up to its last row (the torch backend's windowed prefill)."""
    pairs = 0
    for start in range(0, query, PREFILL_QUERY_SLICE):
        end = min(query, start + PREFILL_QUERY_SLICE)
        pairs += (end - start) * (context + end - max(0, context + start - window + 1))
    return pairs


def step_features(batch: StepBatch) -> StepFeatures:
    """One pass over the batch.

    A prefill chunk of q new tokens after ctx cached ones attends, for its i-th token (i = 1..q), to
    ctx + i keys, so it computes q * ctx + q * (q + 1) / 2 query-key pairs: q * (ctx + (q + 1) / 2).
    A decode is the q = 1 case; it is kept apart because its cost is reading KV, not computing.
    With a sliding window W each query reads at most W keys: a decode min(ctx + 1, W), a chunk's pairs
    ``windowed_keys(ctx + 1, q, W)``, its earlier KV min(ctx, W - 1) (what its first query reads).
    """
    if batch.sliding_window is not None:
        return _windowed_step_features(batch)
    if batch.attention_chunk_size is not None:
        return _chunked_step_features(batch)
    scheduled = batch.num_scheduled_tokens
    computed = batch.num_computed_tokens
    if len(scheduled) != len(computed):
        raise ValueError(f"StepBatch lists differ in length: num_scheduled_tokens has {len(scheduled)} entries, "
                         f"num_computed_tokens {len(computed)}")
    drafts = batch.num_spec_tokens
    if drafts is not None and len(drafts) != len(scheduled):
        raise ValueError(f"StepBatch lists differ in length: num_scheduled_tokens has {len(scheduled)} entries, "
                         f"num_spec_tokens {len(drafts)}")
    num_spec_tokens = spec_attention_work = num_spec_reqs = spec_context_tokens = 0
    num_tokens = 0
    num_prefill_reqs = num_prefill_tokens = prefill_context_tokens = prefill_attention_work = 0
    prefill_attention_dense_work = context_prefill_dense_work = prefill_attention_sliced_work = 0
    num_decode_reqs = decode_context_tokens = 0
    max_seq_len = 0
    for index, (q, ctx) in enumerate(zip(scheduled, computed, strict=True)):
        seq_len = ctx + q
        num_drafts = drafts[index] if drafts is not None else 0
        if num_drafts:
            if num_drafts != q - 1:
                raise ValueError(f"StepBatch: a request verifying {num_drafts} draft tokens must be scheduled "
                                 f"{num_drafts + 1} tokens, got {q}")
            num_decode_reqs += 1
            decode_context_tokens += seq_len
            num_spec_tokens += num_drafts
            spec_attention_work += num_drafts * ctx + num_drafts * (num_drafts + 1) // 2
            num_spec_reqs += 1
            spec_context_tokens += seq_len
        elif q == 1:
            num_decode_reqs += 1
            decode_context_tokens += seq_len
        elif q > 1:
            num_prefill_reqs += 1
            num_prefill_tokens += q
            prefill_context_tokens += ctx
            prefill_attention_work += q * ctx + q * (q + 1) // 2  # q(q+1) is even: the division is exact
            prefill_attention_dense_work += q * (ctx + q)
            if ctx:
                context_prefill_dense_work += q * (ctx + q)
            prefill_attention_sliced_work += sliced_prefill_pairs(q, ctx)
        else:
            raise ValueError(f"StepBatch.num_scheduled_tokens must be >= 1 for every scheduled request, got {q}")
        num_tokens += q
        if seq_len > max_seq_len:
            max_seq_len = seq_len
    return StepFeatures(
        num_reqs=len(scheduled),
        num_tokens=num_tokens,
        num_prefill_reqs=num_prefill_reqs,
        num_prefill_tokens=num_prefill_tokens,
        num_decode_reqs=num_decode_reqs,
        decode_context_tokens=decode_context_tokens,
        prefill_context_tokens=prefill_context_tokens,
        prefill_attention_work=prefill_attention_work,
        max_seq_len=max_seq_len,
        prefill_attention_dense_work=prefill_attention_dense_work,
        context_prefill_dense_work=context_prefill_dense_work,
        prefill_attention_sliced_work=prefill_attention_sliced_work,
        shared_context_tokens=batch.shared_context_tokens,
        kv_block_runs=batch.kv_block_runs,
        num_spec_tokens=num_spec_tokens,
        spec_attention_work=spec_attention_work,
        num_spec_reqs=num_spec_reqs,
        spec_context_tokens=spec_context_tokens,
        num_encoder_tokens=sum(batch.encoder_input_lengths) if batch.encoder_input_lengths else 0,
        encoder_attention_work=sum(length * length for length in batch.encoder_input_lengths)
        if batch.encoder_input_lengths else 0,
    )


def _windowed_step_features(batch: StepBatch) -> StepFeatures:
    """``step_features`` of a sliding-window model: every attention term counts the keys in each query's
    window; the token and request counts are the plain ones."""
    window = batch.sliding_window
    plain = step_features(StepBatch(batch.num_scheduled_tokens, batch.num_computed_tokens, batch.shared_context_tokens,
                                    batch.kv_block_runs, batch.num_spec_tokens,
                                    encoder_input_lengths=batch.encoder_input_lengths))
    drafts = batch.num_spec_tokens
    decode_context_tokens = prefill_context_tokens = prefill_attention_work = 0
    prefill_attention_dense_work = context_prefill_dense_work = prefill_attention_sliced_work = 0
    spec_attention_work = spec_context_tokens = 0
    for index, (q, ctx) in enumerate(zip(batch.num_scheduled_tokens, batch.num_computed_tokens)):
        num_drafts = drafts[index] if drafts is not None else 0
        if num_drafts or q == 1:
            # A decode, or a verification whose rows read like decodes: its last row's keys, as plain counts it.
            decode_context_tokens += min(ctx + q, window)
            if num_drafts:
                spec_attention_work += windowed_keys(ctx + 1, num_drafts, window)
                spec_context_tokens += min(ctx + q, window)
            continue
        earlier = min(ctx, window - 1)  # cached keys the chunk's first query reads
        prefill_context_tokens += earlier
        prefill_attention_work += windowed_keys(ctx + 1, q, window)
        prefill_attention_dense_work += q * (earlier + q)
        if ctx:
            context_prefill_dense_work += q * (earlier + q)
        prefill_attention_sliced_work += windowed_sliced_pairs(q, ctx, window)
    limited = dict(decode_context_tokens=decode_context_tokens, prefill_context_tokens=prefill_context_tokens,
                   prefill_attention_work=prefill_attention_work,
                   prefill_attention_dense_work=prefill_attention_dense_work,
                   context_prefill_dense_work=context_prefill_dense_work,
                   prefill_attention_sliced_work=prefill_attention_sliced_work, spec_attention_work=spec_attention_work,
                   spec_context_tokens=spec_context_tokens)
    return _over_layers(plain, limited, batch.sliding_window_fraction)


# The attention terms a window or chunk limits; the token and request counts stay the plain ones.
_ATTENTION_TERMS = ("decode_context_tokens", "prefill_context_tokens", "prefill_attention_work",
                    "prefill_attention_dense_work", "context_prefill_dense_work", "prefill_attention_sliced_work",
                    "spec_attention_work", "spec_context_tokens")


def _over_layers(plain: StepFeatures, limited: dict[str, int], fraction: float) -> StepFeatures:
    """``plain`` with each attention term the mean over layers of its limited value (in ``fraction`` of them) and
    its plain one (what a cost linear in it, summed over the layers, needs), rounded."""
    for term in _ATTENTION_TERMS:
        value = limited[term]
        setattr(plain, term, value if fraction == 1 else round(fraction * value + (1 - fraction) * getattr(plain, term)))
    return plain


def _chunked_step_features(batch: StepBatch) -> StepFeatures:
    """``step_features`` of a model with chunked layers: their attention terms are those of the step cut into
    per-chunk virtual requests (each request's queries split at chunk boundaries, each piece's context starting at
    its chunk's first token), which is how the engine attends them (engine/runner/attention/local_attention.py).
    A verification crossing a boundary counts as chunks of a prefill there."""
    chunk = batch.attention_chunk_size
    plain = step_features(StepBatch(batch.num_scheduled_tokens, batch.num_computed_tokens, batch.shared_context_tokens,
                                    batch.kv_block_runs, batch.num_spec_tokens,
                                    encoder_input_lengths=batch.encoder_input_lengths))
    scheduled, computed, drafts = [], [], []
    for index, (q, ctx) in enumerate(zip(batch.num_scheduled_tokens, batch.num_computed_tokens)):
        num_drafts = batch.num_spec_tokens[index] if batch.num_spec_tokens is not None else 0
        start = ctx
        while start < ctx + q:
            chunk_start = start - start % chunk
            end = min(ctx + q, chunk_start + chunk)
            scheduled.append(end - start)
            computed.append(start - chunk_start)
            drafts.append(num_drafts if (start, end) == (ctx, ctx + q) else 0)
            start = end
    local = step_features(StepBatch(scheduled, computed, num_spec_tokens=drafts if batch.num_spec_tokens else None))
    return _over_layers(plain, {term: getattr(local, term) for term in _ATTENTION_TERMS},
                        batch.attention_chunk_fraction)
