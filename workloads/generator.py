"""``generate_requests``: a validated workload -> the list of timed requests, sorted by arrival.

The seed fixes everything, token ids included. Each quantity draws from its own stream
(random_streams.py) and every draw takes one value per request in request order, so:

- changing the arrival process (a rate sweep) leaves every request's lengths, tokens, prefix group and
  priority unchanged; with ``duration_s``, request i is the same request at every rate, only more or
  fewer of them arrive;
- changing the output-length distribution leaves the prompts unchanged (unless the total length cap
  then trims them).
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from workloads.arrivals import TraceArrival
from workloads.config import WorkloadConfig
from workloads.distributions import LengthDistribution, TraceLength
from workloads.errors import Problem, WorkloadError
from workloads.image_placement import ImageDraws, image_token_id
from workloads.lora_section import adapter_name
from workloads.random_streams import Stream, class_seed, phase_seed, random_stream, stream_seed
from workloads.request_spec import FollowUpTurn, RequestSpec
from workloads.session_turns import draw_later_turns
from workloads.sections import SharedPrefixSection
from workloads.tokens import TokenVocabulary, assemble_prompts
from workloads.trace_sampling import select_rows, synthetic_arrivals, trace_arrivals
from workloads.traces import BASE_MODEL, TraceRecords
from workloads.workload_section import StreamSection

NO_GROUP = -1
NO_ADAPTER = BASE_MODEL  # a base-model request (workload.lora unset, drawn into base_model_fraction, or the trace says so)


def generate_requests(
    config: WorkloadConfig,
    vocab_size: int,
    reserved_token_ids: Iterable[int] = (),
    model_max_len: int | None = None,
    tokens_per_image: int | None = None,
) -> list[RequestSpec]:
    """The workload's requests, sorted by arrival time, ids ``req-000000``, ``req-000001``, ... in that order.

    With ``workload.phases``, each stretch of the stream is generated on its own (its own seed, derived
    from the workload's and the stretch's index, so adding a phase leaves the earlier ones unchanged)
    and starts ``gap_s`` after the previous stretch's last arrival.

    With ``workload.classes``, each further class is generated on its own too (its seed derived from the
    workload's and the class's position, so adding a class leaves every other class's requests as they
    were, ids aside), its arrivals shifted by its ``start_s``, and all classes' requests are merged by
    arrival time (a tie keeps class order, then each class's own order); ids number the merged stream.

    ``model_max_len``: the model's length limit, the cap on prompt + output when the workload sets neither
    ``max_total_len`` nor ``engine.max_model_len`` (``WorkloadConfig.max_total_len``).

    ``tokens_per_image``: the model's vision encoder's placeholder tokens per image, for ``workload.images``
    sections that do not set their own (None: the model has no fixed count). Images' placeholders are the
    vocabulary's last id, which is then kept out of the text.
    """
    if config.has_images():
        reserved_token_ids = (*reserved_token_ids, image_token_id(vocab_size))
    vocabulary = TokenVocabulary(vocab_size, reserved_token_ids)
    images = ImageDraws(image_token_id(vocab_size), tokens_per_image)
    generated = _first_class(config, vocabulary, model_max_len, images)
    for index, request_class in enumerate(config.workload.classes or [], start=1):
        requests = _generate_stretch(request_class, class_seed(config.seed, index),
                                     config.max_total_len(request_class, model_max_len), vocabulary,
                                     f"workload.classes[{index - 1}]", images)
        generated += [(request_class.start_s + arrival, *rest, request_class.name) for arrival, *rest in requests]
    # Stable: every class's rows are already in arrival order, so the merge keeps each class's own order.
    generated.sort(key=lambda row: row[0])
    width = max(6, len(str(len(generated) - 1)))
    specs = []
    for index, (arrival_time, prompt, output_lens, priority, group, adapter, later_turns, shown,
                request_class) in enumerate(generated):
        prompt_id = f"req-{index:0{width}d}"
        # n > 1: vLLM's ids for a prompt's completions, f"{i}_{request_id}", all arriving with the prompt.
        request_ids = [prompt_id] if len(output_lens) == 1 else [f"{i}_{prompt_id}" for i in range(len(output_lens))]
        # A prompt's completions run with its adapter, as vLLM fans out n with the request's LoRA.
        lora_name, lora_int_id = (None, 0) if adapter == NO_ADAPTER else (adapter_name(adapter), adapter + 1)
        # A session's later turns are named after its first: req-000012, req-000012-turn2, ... (n is 1 then).
        next_turns = tuple(FollowUpTurn(f"{prompt_id}-turn{turn}", tokens, output_len, think_time)
                           for turn, (tokens, output_len, think_time) in enumerate(later_turns or (), start=2))
        specs += [RequestSpec(request_id=request_id, arrival_time=arrival_time, prompt_token_ids=prompt,
                              output_len=output_len, priority=priority, prefix_group=group,
                              request_class=request_class, lora_name=lora_name, lora_int_id=lora_int_id,
                              next_turns=next_turns, session_id=None if later_turns is None else prompt_id,
                              images=shown)
                  for request_id, output_len in zip(request_ids, output_lens)]
    return specs


def _first_class(config: WorkloadConfig, vocabulary: TokenVocabulary, model_max_len: int | None, images: ImageDraws
                 ) -> list[tuple]:
    """The top-level stream, its phases one after the other, as rows of ``_generate_stretch`` plus the
    class name."""
    generated: list[tuple] = []
    name = config.workload.class_name
    offset = 0.0
    for index, stretch in enumerate(config.workload.stretches()):
        where = "workload" if index == 0 else f"workload.phases[{index - 1}]"
        seed = config.seed if index == 0 else phase_seed(config.seed, index)
        start = offset + (getattr(stretch, "gap_s", 0.0) if index else 0.0)
        requests = _generate_stretch(stretch, seed, config.max_total_len(stretch, model_max_len), vocabulary, where,
                                     images)
        generated += [(start + arrival, *rest, name) for arrival, *rest in requests]
        offset = start + requests[-1][0]
    return generated


def _generate_stretch(workload: StreamSection, seed: int, cap: int | None, vocabulary: TokenVocabulary,
                      where: str, images: ImageDraws) -> list[tuple]:
    """One stretch's prompts as (arrival time, prompt, output length of each of its ``n`` completions,
    priority, prefix group, LoRA adapter index or NO_ADAPTER, its session's later turns or None without
    sessions, its images as (identifier, offset, tokens)), in order."""
    arrival_times, trace_rows = _arrivals_and_rows(workload, seed)
    count = len(arrival_times)
    if count == 0:
        raise WorkloadError(
            Problem(f"{where}.duration_s", "is too short for even one request to arrive", workload.duration_s)
        )
    records = workload.trace.records() if workload.trace is not None and trace_rows is not None else None

    prompt_column = records.prompt_lens[trace_rows] if records is not None else None
    output_column = records.output_lens[trace_rows] if records is not None else None
    prompt_lens = _lengths(workload.prompt_len, random_stream(seed, Stream.PROMPT_LENGTHS), count, prompt_column)
    output_lens = _lengths(workload.output_len, random_stream(seed, Stream.OUTPUT_LENGTHS), count, output_column)
    groups = _prefix_groups(workload.shared_prefix, seed, count)
    minimum_prompt = np.ones(count, dtype=np.int64)
    if workload.shared_prefix is not None:
        minimum_prompt[groups != NO_GROUP] = workload.shared_prefix.prefix_len + 1
    prompt_lens = np.maximum(prompt_lens, minimum_prompt)
    # Images' tokens come on top of the text's (their own streams: workloads/images.py); the cap fits the sum.
    shown = images.draw(workload.images, seed, count, f"{where}.images")
    image_tokens = np.array([sum(tokens for _, tokens in request) for request in shown], dtype=np.int64)
    prompt_lens = prompt_lens + image_tokens
    minimum_prompt = minimum_prompt + image_tokens
    if cap is not None:
        prompt_lens, output_lens = fit_total_length(prompt_lens, output_lens, cap, minimum_prompt)
    priorities = _priorities(workload, seed, count)

    leading = _leading_tokens(workload, seed, vocabulary, groups, prompt_lens - image_tokens, records, trace_rows)
    token_rng = random_stream(seed, Stream.PROMPT_TOKENS)
    prompts = assemble_prompts(prompt_lens - image_tokens, leading,
                               lambda num_tokens: vocabulary.random_tokens(token_rng, num_tokens))
    placed = images.place(prompts, leading, shown)
    completion_lens = _completion_output_lengths(workload, seed, output_lens, prompt_lens, output_column, cap)
    # Its own stream: adding workload.lora leaves every other draw (arrivals, lengths, tokens) as it was.
    if workload.lora is None:
        adapters = [NO_ADAPTER] * count
    elif workload.uses_trace_adapters():
        assert records is not None and records.lora_adapters is not None  # validation guarantees them
        adapters = records.lora_adapters[trace_rows].tolist()  # BASE_MODEL == NO_ADAPTER
    else:
        adapters = workload.lora.pick(random_stream(seed, Stream.LORA_ADAPTERS), count).tolist()
    # Its own streams too: adding workload.sessions leaves every first turn as it was.
    later_turns = [None] * count if workload.sessions is None else draw_later_turns(
        workload.sessions, workload.output_len, seed, prompt_lens, output_lens, cap, vocabulary)
    return [
        (arrival_time, prompt, completions, priority, None if group == NO_GROUP else group, adapter, turns, items)
        for arrival_time, prompt, completions, priority, group, adapter, turns, items in zip(
            arrival_times.tolist(), prompts, completion_lens, priorities.tolist(), groups.tolist(), adapters,
            later_turns, placed, strict=True
        )
    ]


def _completion_output_lengths(workload: StreamSection, seed: int, output_lens: np.ndarray, prompt_lens: np.ndarray,
                               trace_column: np.ndarray | None, cap: int | None) -> list[list[int]]:
    """Per prompt, the output length of each of its ``n`` completions: the first is the prompt's own draw,
    the others their own draws from ``output_len`` (a trace's length repeats: it has one per row), each
    within the length cap."""
    if workload.n == 1:
        return [[length] for length in output_lens.tolist()]
    count, extra = len(output_lens), workload.n - 1
    rng = random_stream(seed, Stream.COMPLETION_OUTPUT_LENGTHS)
    if trace_column is not None and isinstance(workload.output_len, TraceLength):
        others = np.repeat(output_lens[:, None], extra, axis=1)
    else:
        others = _lengths(workload.output_len, rng, count * extra, None).reshape(count, extra)
    if cap is not None:
        others = np.minimum(others, np.maximum(cap - prompt_lens, 1)[:, None])
    return [[first, *rest] for first, rest in zip(output_lens.tolist(), others.tolist(), strict=True)]


def fit_total_length(
    prompt_lens: np.ndarray, output_lens: np.ndarray, cap: int, minimum_prompt: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Trim requests longer than ``cap`` tokens in total, prompt and output in proportion to their sizes.

    Cutting both in proportion keeps the shape of both distributions (cutting only prompts would turn
    long-context traffic into decode traffic, and vice versa). A prompt never drops below its minimum
    (its shared prefix plus one token) and every request keeps at least one output token; validation
    guarantees ``cap >= minimum_prompt + 1``.
    """
    total = prompt_lens + output_lens
    too_long = total > cap
    if not too_long.any():
        return prompt_lens, output_lens
    excess = np.where(too_long, total - cap, 0)
    output_cut = (excess * output_lens) // total
    trimmed_prompt = np.maximum(prompt_lens - (excess - output_cut), minimum_prompt)
    prompt_lens = np.where(too_long, trimmed_prompt, prompt_lens)
    output_lens = np.where(too_long, cap - prompt_lens, output_lens)
    return prompt_lens, output_lens


def _arrivals_and_rows(workload: StreamSection, seed: int) -> tuple[np.ndarray, np.ndarray | None]:
    if isinstance(workload.arrival, TraceArrival):
        assert workload.trace is not None  # validation guarantees it
        return trace_arrivals(workload.arrival, workload.trace, workload.num_requests, workload.duration_s)
    times = synthetic_arrivals(
        workload.arrival, stream_seed(seed, Stream.ARRIVALS), workload.num_requests, workload.duration_s
    )
    if workload.trace is None or not workload.uses_trace_lengths():
        return times, None
    return times, select_rows(workload.trace, len(times), random_stream(seed, Stream.TRACE_ROWS))


def _lengths(
    distribution: LengthDistribution, rng: np.random.Generator, count: int, trace_column: np.ndarray | None
) -> np.ndarray:
    """Sampled lengths, or the trace's (``trace_column``: the selected rows' lengths) clipped to min/max."""
    if isinstance(distribution, TraceLength):
        assert trace_column is not None  # validation guarantees a trace
        return distribution.clip(trace_column)
    return distribution.sample(rng, count)


def _prefix_groups(shared_prefix: SharedPrefixSection | None, seed: int, count: int) -> np.ndarray:
    if shared_prefix is None:
        return np.full(count, NO_GROUP, dtype=np.int64)
    # One (membership, group) pair of uniforms per request, row by row: request i's group does not
    # depend on how many requests there are.
    uniforms = random_stream(seed, Stream.PREFIX_GROUPS).random((count, 2))
    groups = np.minimum((uniforms[:, 1] * shared_prefix.num_groups).astype(np.int64), shared_prefix.num_groups - 1)
    return np.where(uniforms[:, 0] < shared_prefix.fraction, groups, NO_GROUP)


def _priorities(workload: StreamSection, seed: int, count: int) -> np.ndarray:
    if workload.priority is None:
        return np.zeros(count, dtype=np.int64)
    cumulative = np.cumsum(workload.priority.probabilities())
    picks = np.searchsorted(cumulative, random_stream(seed, Stream.PRIORITIES).random(count), side="right")
    return np.asarray(workload.priority.levels, dtype=np.int64)[np.minimum(picks, len(cumulative) - 1)]


def _leading_tokens(
    workload: StreamSection,
    seed: int,
    vocabulary: TokenVocabulary,
    groups: np.ndarray,
    prompt_lens: np.ndarray,
    records: TraceRecords | None,
    trace_rows: np.ndarray | None,
) -> list[tuple[int, ...] | None]:
    """Per request, the tokens its prompt starts with: its group's prefix, its trace blocks, or None."""
    if workload.shared_prefix is not None:
        prefix = workload.shared_prefix
        prefixes = vocabulary.random_tokens(
            random_stream(seed, Stream.PREFIX_TOKENS), prefix.num_groups * prefix.prefix_len
        ).reshape(prefix.num_groups, prefix.prefix_len)
        prefix_tuples = [tuple(row) for row in prefixes.tolist()]
        return [None if group == NO_GROUP else prefix_tuples[group] for group in groups.tolist()]
    if workload.uses_block_hashes() and records is not None and trace_rows is not None and records.has_block_hashes:
        return _hashed_block_prompts(records, trace_rows, prompt_lens, vocabulary, seed)
    return [None] * len(groups)


def _hashed_block_prompts(
    records: TraceRecords, trace_rows: np.ndarray, prompt_lens: np.ndarray, vocabulary: TokenVocabulary, seed: int
) -> list[tuple[int, ...] | None]:
    # Only the blocks a (possibly trimmed) prompt covers; each distinct block is hashed once and the
    # requests gather their blocks' rows, the last block cut to the prompt length.
    block_size = records.block_size
    lengths = prompt_lens.tolist()
    per_request = [
        records.hash_ids_of(row)[: -(-length // block_size)]
        for row, length in zip(trace_rows.tolist(), lengths, strict=True)
    ]
    all_ids = np.concatenate(per_request) if per_request else np.zeros(0, dtype=np.int64)
    unique_ids, inverse = np.unique(all_ids, return_inverse=True)
    blocks = vocabulary.hashed_blocks(seed, unique_ids, block_size)
    leading: list[tuple[int, ...] | None] = []
    start = 0
    for ids, length in zip(per_request, lengths, strict=True):
        rows = inverse[start : start + len(ids)]
        start += len(ids)
        leading.append(tuple(blocks[rows].reshape(-1)[:length].tolist()) if len(ids) else None)
    return leading
