"""Collects a run's request and step traces as columns, in the run-directory schema of DESIGN.md.

Both executors feed it the same events (arrivals, one call per step, the engine core's outputs) with
their own clock: virtual time in the simulator, wall-clock time in a real run. Columns are plain lists
appended once per event, so recording costs little next to the step itself.
"""

from __future__ import annotations

import copy
import math
from typing import Iterable

from engine.core.outputs import EngineCoreOutput
from engine.core.scheduler import Scheduler
from engine.core.scheduler_output import SchedulerOutput
from sim.cost_models import StepFeatures
from workloads.request_spec import DEFAULT_REQUEST_CLASS

NAN = math.nan


class TraceRecorder:
    """``record_schedule`` adds two list columns to the step trace, the ids of the requests scheduled
    in each step and their token counts, so that two runs can be compared decision by decision."""

    def __init__(self, record_schedule: bool = False) -> None:
        self.record_schedule = record_schedule
        self.request_ids: list[str] = []
        self._index: dict[str, int] = {}
        self.arrival_time: list[float] = []
        self.scheduled_time: list[float] = []
        self.finish_time: list[float] = []
        self.num_prompt_tokens: list[int] = []
        self.num_cached_tokens: list[int] = []
        self.num_preemptions: list[int] = []
        self.finish_reason: list[str | None] = []
        self.status_message: list[str | None] = []
        self.priority: list[int] = []
        self.request_class: list[str] = []
        # KV offloading's loads (sim/kv_offload_loads.HostLoads), whose columns join the requests table.
        self.offload_loads = None
        # Speculative decoding: the engine's counts (engine.core.spec_decode.SpecDecodingStats) when it speculates
        # (track_spec_decoding).
        self.spec_decoding = None
        self._spec_baseline = None  # its counts when tracking began (track_spec_decoding)
        self._accepted_before = 0
        # Multi-LoRA serving: the executor's adapter state (sim/lora_steps.LoRASteps) when it serves adapters
        # (track_lora), and each request's adapter.
        self.lora = None
        self.lora_names: list[str | None] | None = None
        # Multi-turn sessions (track_sessions): each request's session (its first turn's id) and turn; None without.
        self.session_ids: list[str | None] | None = None
        self.turns: list[int] | None = None
        # A client with a concurrency limit (track_client_waits): the seconds each request waited to be sent.
        self.client_waits: list[float] | None = None
        # Requests with images (track_images): how many each shows and their placeholder tokens; None without.
        self.image_counts: list[int] | None = None
        self.image_tokens: list[int] | None = None
        self.token_times: dict[str, list[float]] = {}
        self.steps: dict[str, list] = {name: [] for name in STEP_COLUMNS}
        self._carried_preemptions = 0  # from steps that scheduled nothing (on_empty_step)
        # Prefix-cache lookups of such steps (a disaggregated decode replica's load starting while it is idle).
        self._carried_prefix_hit_tokens = 0
        self._carried_prefix_query_tokens = 0
        if record_schedule:
            self.steps["scheduled_request_ids"] = []
            self.steps["scheduled_token_counts"] = []

    def on_arrival(self, request_id: str, now: float, num_prompt_tokens: int, priority: int = 0,
                   request_class: str = DEFAULT_REQUEST_CLASS, lora_name: str | None = None,
                   session_id: str | None = None, turn: int = 1, client_wait_s: float = 0.0) -> None:
        self._index[request_id] = len(self.request_ids)
        self.request_ids.append(request_id)
        self.arrival_time.append(now)
        self.scheduled_time.append(NAN)
        self.finish_time.append(NAN)
        self.num_prompt_tokens.append(num_prompt_tokens)
        self.num_cached_tokens.append(0)
        self.num_preemptions.append(0)
        self.finish_reason.append(None)
        self.status_message.append(None)
        self.priority.append(priority)
        self.request_class.append(request_class)
        if self.lora_names is not None:
            self.lora_names.append(lora_name)
        if self.session_ids is not None:
            self.session_ids.append(session_id)
            self.turns.append(turn)
        if self.client_waits is not None:
            self.client_waits.append(client_wait_s)
        if self.image_counts is not None:
            self.image_counts.append(0)
            self.image_tokens.append(0)
        self.token_times[request_id] = []

    def track_images(self) -> None:
        """Record a workload with images: the requests table gains ``num_images`` and ``num_image_tokens``, the step
        table MULTIMODAL_STEP_COLUMNS. Before any event."""
        if self.steps["step"] or self.request_ids:
            raise RuntimeError("track_images must be called before the first arrival or step is recorded")
        self.image_counts, self.image_tokens = [], []
        for name in MULTIMODAL_STEP_COLUMNS:
            self.steps[name] = []

    def note_images(self, request_id: str, images) -> None:
        """The images a request just recorded by ``on_arrival`` shows: (identifier, offset, tokens) each."""
        position = self._index[request_id]
        self.image_counts[position] = len(images)
        self.image_tokens[position] = sum(tokens for _, _, tokens in images)

    def on_empty_step(self, scheduler_output: SchedulerOutput) -> None:
        """A step that scheduled no token but preempted requests (the one running request that needed a
        block was its own victim), or started KV loads (a disaggregated decode replica): it takes no time and
        gets no row, and its preemptions and prefix-cache lookups are counted in the next recorded step's
        row, so that the step table's preemptions still add up to the requests', and its lookups to the
        prompts'."""
        for request_id in scheduler_output.preempted_req_ids:
            self.num_preemptions[self._index[request_id]] += 1
        self._carried_preemptions += len(scheduler_output.preempted_req_ids)
        self._carried_prefix_hit_tokens += scheduler_output.num_prefix_hit_tokens
        self._carried_prefix_query_tokens += scheduler_output.num_prefix_query_tokens

    def _take_carried_preemptions(self) -> int:
        carried, self._carried_preemptions = self._carried_preemptions, 0
        return carried

    def on_step(self, start: float, duration: float, scheduler_output: SchedulerOutput,
                features: StepFeatures, scheduler: Scheduler) -> None:
        index = self._index
        for new_request in scheduler_output.scheduled_new_reqs:
            self.scheduled_time[index[new_request.req_id]] = start
        for request_id in scheduler_output.preempted_req_ids:
            self.num_preemptions[index[request_id]] += 1
        manager = scheduler.kv_cache_manager
        steps = self.steps
        steps["step"].append(len(steps["step"]))
        steps["start_time"].append(start)
        steps["duration"].append(duration)
        steps["num_prefill_reqs"].append(features.num_prefill_reqs)
        steps["num_decode_reqs"].append(features.num_decode_reqs)
        steps["num_scheduled_tokens"].append(features.num_tokens)
        steps["num_prefill_tokens"].append(features.num_prefill_tokens)
        steps["num_context_tokens"].append(features.decode_context_tokens + features.prefill_context_tokens)
        steps["num_running"].append(len(scheduler.running))
        steps["num_waiting"].append(len(scheduler.waiting))
        num_used = manager.num_usable_blocks - manager.num_free_blocks
        steps["kv_blocks_used"].append(num_used)
        steps["kv_usage"].append(num_used / manager.num_usable_blocks)
        steps["num_preemptions"].append(len(scheduler_output.preempted_req_ids) + self._take_carried_preemptions())
        steps["prefix_hit_tokens"].append(scheduler_output.num_prefix_hit_tokens + self._carried_prefix_hit_tokens)
        steps["prefix_query_tokens"].append(scheduler_output.num_prefix_query_tokens + self._carried_prefix_query_tokens)
        self._carried_prefix_hit_tokens = self._carried_prefix_query_tokens = 0
        steps["prefill_attention_work"].append(features.prefill_attention_work)
        steps["decode_context_tokens"].append(features.decode_context_tokens)
        steps["prefill_context_tokens"].append(features.prefill_context_tokens)
        steps["num_reqs"].append(features.num_reqs)
        steps["max_seq_len"].append(features.max_seq_len)
        steps["prefill_attention_dense_work"].append(features.prefill_attention_dense_work)
        steps["context_prefill_dense_work"].append(features.context_prefill_dense_work)
        steps["prefill_attention_sliced_work"].append(features.prefill_attention_sliced_work)
        steps["shared_context_tokens"].append(features.shared_context_tokens)
        steps["kv_block_runs"].append(features.kv_block_runs)
        if self.spec_decoding is not None:
            self._record_verification(features)
        if self.lora is not None:
            self._record_lora(features, self.lora.last_num_loads, self.lora.last_num_disk_loads, self.lora.last_load_s)
        if self.image_counts is not None:
            steps["num_encoder_items"].append(len(scheduler_output.encoder_input_lengths))
            steps["num_encoder_tokens"].append(scheduler_output.num_encoder_tokens)
        if self.record_schedule:
            steps["scheduled_request_ids"].append(list(scheduler_output.num_scheduled_tokens))
            steps["scheduled_token_counts"].append(list(scheduler_output.num_scheduled_tokens.values()))

    def on_drafts(self, scheduler_output: SchedulerOutput, model_runner_output) -> None:
        """A speculating real run's step, for its replay (sim/recorded_drafts.py): per scheduled request, in the
        order of ``scheduled_request_ids``, how many tokens the executor returned and how many drafts it
        proposed. Call after ``on_step`` of the same step, with ``record_schedule``."""
        steps = self.steps
        rows = model_runner_output.req_id_to_index
        sampled, proposals = model_runner_output.sampled_token_ids, model_runner_output.spec_token_ids
        request_ids = scheduler_output.num_scheduled_tokens
        steps.setdefault(SAMPLED_COUNTS, []).append(
            [len(sampled[rows[request_id]]) if request_id in rows else 0 for request_id in request_ids])
        steps.setdefault(PROPOSED_COUNTS, []).append([len(proposals.get(request_id, ())) for request_id in request_ids])

    def _record_verification(self, features: StepFeatures) -> None:
        """The step's drafts verified and accepted. The engine applies a step's outputs before it is recorded
        (one batch at a time: speculation is refused with batches in flight), so its counts include this step."""
        steps = self.steps
        accepted = self.spec_decoding.num_accepted_tokens
        steps["num_spec_tokens"].append(features.num_spec_tokens)
        steps["spec_accepted_tokens"].append(accepted - self._accepted_before)
        steps["spec_attention_work"].append(features.spec_attention_work)
        steps["num_spec_reqs"].append(features.num_spec_reqs)
        steps["spec_context_tokens"].append(features.spec_context_tokens)
        self._accepted_before = accepted

    def track_sessions(self) -> None:
        """Record a workload of multi-turn sessions: the requests table gains ``session_id`` and ``turn``. Before
        any event."""
        if self.steps["step"] or self.request_ids:
            raise RuntimeError("track_sessions must be called before the first arrival or step is recorded")
        self.session_ids, self.turns = [], []

    def track_client_waits(self) -> None:
        """Record a client with a concurrency limit: the requests table gains ``client_wait_s``. Before any event."""
        if self.steps["step"] or self.request_ids:
            raise RuntimeError("track_client_waits must be called before the first arrival or step is recorded")
        self.client_waits = []

    def track_lora(self, lora_steps) -> None:
        """Record an engine that serves LoRA adapters (``lora_steps``: its executor's sim/lora_steps.LoRASteps; None
        does nothing): the step table gains LORA_STEP_COLUMNS, the requests table ``lora_name``. Before any event."""
        if lora_steps is None:
            return
        if self.steps["step"] or self.request_ids:
            raise RuntimeError("track_lora must be called before the first arrival or step is recorded")
        self.lora = lora_steps
        self.lora_names = []
        for name in LORA_STEP_COLUMNS:
            self.steps[name] = []

    def _record_lora(self, features: StepFeatures, num_loads: int, num_disk_loads: int, load_s: float) -> None:
        steps = self.steps
        steps["num_lora_tokens"].append(features.num_lora_tokens)
        steps["num_active_loras"].append(features.num_active_loras)
        steps["num_lora_loads"].append(num_loads)
        steps["num_lora_disk_loads"].append(num_disk_loads)
        steps["lora_load_s"].append(load_s)

    def track_spec_decoding(self, stats) -> None:
        """Record a speculating engine (``stats``: its scheduler's SpecDecodingStats; None does nothing): the step
        table gains the verification columns (SPEC_STEP_COLUMNS), and the summary its counts. Before any step."""
        if stats is None:
            return
        if self.steps["step"]:
            raise RuntimeError("track_spec_decoding must be called before the first step is recorded")
        self.spec_decoding = stats
        self._accepted_before = stats.num_accepted_tokens
        # What the engine counted before this recording (a real run's warm-up requests): not the run's.
        self._spec_baseline = copy.deepcopy(stats)
        for name in SPEC_STEP_COLUMNS:
            self.steps[name] = []

    def spec_decoding_counts(self) -> list[dict]:
        """The recorded steps' speculative decoding counts (SpecDecodingStats.to_dict()): one dict, none without it."""
        stats, before = self.spec_decoding, self._spec_baseline
        if stats is None:
            return []
        run = stats.since(before)
        return [run.to_dict()]

    def on_outputs(self, outputs: Iterable[EngineCoreOutput], now: float) -> None:
        token_times = self.token_times
        for output in outputs:
            new_token_ids = output.new_token_ids
            if new_token_ids:
                times = token_times[output.request_id]
                if len(new_token_ids) == 1:
                    times.append(now)
                else:
                    times.extend([now] * len(new_token_ids))
            if output.finish_reason is not None:
                position = self._index[output.request_id]
                self.finish_time[position] = now
                self.finish_reason[position] = output.finish_reason
                self.status_message[position] = output.status_message
                self.num_cached_tokens[position] = output.num_cached_tokens

    def on_fast_forward(self, starts: list[float], durations: list[float], features: list[StepFeatures],
                        result, ends: list[float], scheduler: Scheduler) -> None:
        """Record fast-forwarded decode steps exactly as the ordinary steps would have been recorded."""
        steps = self.steps
        usable = scheduler.kv_cache_manager.num_usable_blocks
        first_step = len(steps["step"])
        for offset in range(result.num_steps):
            step = features[offset]
            num_used = usable - result.num_free_blocks_after[offset]
            steps["step"].append(first_step + offset)
            steps["start_time"].append(starts[offset])
            steps["duration"].append(durations[offset])
            steps["num_prefill_reqs"].append(0)
            steps["num_decode_reqs"].append(step.num_decode_reqs)
            steps["num_scheduled_tokens"].append(step.num_tokens)
            steps["num_prefill_tokens"].append(0)
            steps["num_context_tokens"].append(step.decode_context_tokens)
            steps["num_running"].append(result.num_running_after[offset])
            steps["num_waiting"].append(0)
            steps["kv_blocks_used"].append(num_used)
            steps["kv_usage"].append(num_used / usable)
            steps["num_preemptions"].append(self._take_carried_preemptions() if offset == 0 else 0)
            steps["prefix_hit_tokens"].append(0)
            steps["prefix_query_tokens"].append(0)
            steps["prefill_attention_work"].append(0)
            steps["decode_context_tokens"].append(step.decode_context_tokens)
            steps["prefill_context_tokens"].append(0)
            steps["num_reqs"].append(step.num_reqs)
            steps["max_seq_len"].append(step.max_seq_len)
            steps["prefill_attention_dense_work"].append(0)
            steps["context_prefill_dense_work"].append(0)
            steps["prefill_attention_sliced_work"].append(0)
            steps["shared_context_tokens"].append(step.shared_context_tokens)
            steps["kv_block_runs"].append(step.kv_block_runs)
            if self.image_counts is not None:  # decodes encode nothing
                steps["num_encoder_items"].append(0)
                steps["num_encoder_tokens"].append(0)
            if self.lora is not None:  # only the first step can load (sim/lora_steps.py)
                lora = self.lora
                self._record_lora(step, *((lora.last_num_loads, lora.last_num_disk_loads, lora.last_load_s)
                                          if offset == 0 else (0, 0, 0.0)))
            if self.record_schedule:
                # A fast-forwarded step schedules, in running order, every request still decoding.
                active = [request.request_id for request, finish in zip(result.requests, result.finish_step)
                          if finish < 0 or finish >= offset]
                steps["scheduled_request_ids"].append(active)
                steps["scheduled_token_counts"].append([1] * len(active))
        token_times = self.token_times
        for request, num_new_tokens, finish_step in zip(result.requests, result.num_new_tokens, result.finish_step):
            token_times[request.request_id].extend(ends[:num_new_tokens])
            if finish_step >= 0:
                position = self._index[request.request_id]
                self.finish_time[position] = ends[finish_step]
                self.finish_reason[position] = "length"
                self.num_cached_tokens[position] = max(request.num_cached_tokens, 0)

    def request_columns(self) -> dict[str, list]:
        token_times = [self.token_times[request_id] for request_id in self.request_ids]
        columns = {
            "request_id": self.request_ids,
            "arrival_time": self.arrival_time,
            "scheduled_time": self.scheduled_time,
            "first_token_time": [times[0] if times else NAN for times in token_times],
            "finish_time": self.finish_time,
            "num_prompt_tokens": self.num_prompt_tokens,
            "num_output_tokens": [len(times) for times in token_times],
            "num_cached_tokens": self.num_cached_tokens,
            "num_preemptions": self.num_preemptions,
            "finish_reason": self.finish_reason,
            "status_message": self.status_message,
            "priority": self.priority,
            "request_class": self.request_class,
            "token_times": token_times,
        }
        if self.offload_loads is not None:
            columns.update(self.offload_loads.request_columns(self.request_ids))
        if self.lora_names is not None:
            columns["lora_name"] = self.lora_names
        if self.session_ids is not None:
            columns["session_id"] = self.session_ids
            columns["turn"] = self.turns
        if self.client_waits is not None:
            columns["client_wait_s"] = self.client_waits
        if self.image_counts is not None:
            columns["num_images"] = self.image_counts
            columns["num_image_tokens"] = self.image_tokens
        return columns

    def step_columns(self) -> dict[str, list]:
        return self.steps

    @property
    def num_finished(self) -> int:
        return sum(reason is not None for reason in self.finish_reason)


# A speculating engine's step columns: draft tokens verified (StepFeatures.num_spec_tokens), how many of them
# were accepted, and the query-key pairs of the verification rows (StepFeatures.spec_attention_work).
# A speculating real run's step columns (lists, like scheduled_request_ids) that its replay reads back.
SAMPLED_COUNTS, PROPOSED_COUNTS = "sampled_token_counts", "proposed_draft_counts"
SPEC_STEP_COLUMNS = ("num_spec_tokens", "spec_accepted_tokens", "spec_attention_work", "num_spec_reqs",
                     "spec_context_tokens")
# A LoRA-serving engine's step columns: adapter tokens and distinct adapters of the batch (StepFeatures), the
# adapters it loaded before computing (all, and those read from disk first), and the seconds those loads took
# (part of duration).
LORA_STEP_COLUMNS = ("num_lora_tokens", "num_active_loras", "num_lora_loads", "num_lora_disk_loads", "lora_load_s")
# A run with images: the images the step encoded and their encoder tokens (SchedulerOutput.encoder_input_lengths).
MULTIMODAL_STEP_COLUMNS = ("num_encoder_items", "num_encoder_tokens")

STEP_COLUMNS = (
    "step", "start_time", "duration", "num_prefill_reqs", "num_decode_reqs", "num_scheduled_tokens",
    "num_prefill_tokens", "num_context_tokens", "num_running", "num_waiting", "kv_blocks_used", "kv_usage",
    "num_preemptions", "prefix_hit_tokens", "prefix_query_tokens", "prefill_attention_work",
    "decode_context_tokens", "prefill_context_tokens", "num_reqs", "max_seq_len", "prefill_attention_dense_work",
    "context_prefill_dense_work", "prefill_attention_sliced_work", "shared_context_tokens", "kv_block_runs",
)
