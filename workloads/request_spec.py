"""``RequestSpec``: one request of a generated workload, the same object for the simulator and the engine."""

from __future__ import annotations

from array import array
from dataclasses import dataclass

# The class of a request of a workload without ``workload.classes`` (``workload.class_name``'s default);
# analysis.trace_schema reads a trace without a request_class column as this class too.
DEFAULT_REQUEST_CLASS = "default"


@dataclass(frozen=True, slots=True)
class RequestSpec:
    """A timed request. ``output_len`` is exact: the request runs with ignore_eos and max_tokens = output_len.

    ``priority`` follows vLLM (lower is served first under priority scheduling); ``prefix_group`` is the
    shared-prefix group the prompt starts with, or None (kept so analysis can relate prefix hits to groups).
    ``request_class`` names the workload class (``workload.class_name`` or ``workload.classes[i].name``)
    the request was drawn from; metrics and SLOs are reported per class. ``lora_name`` / ``lora_int_id``: its
    LoRA adapter (vLLM's ``LoRARequest`` fields), None / 0 for the base model.
    """

    request_id: str
    arrival_time: float  # seconds from the run start
    # array('q'): compact (no Python int per token); compares equal to another array of the same ids.
    prompt_token_ids: array
    output_len: int
    priority: int = 0
    prefix_group: int | None = None
    request_class: str = DEFAULT_REQUEST_CLASS
    # The LoRA adapter the request runs with (workload.lora; workloads/lora_section.py): its name and the
    # runner's id (>= 1), or None and 0 for the base model.
    lora_name: str | None = None
    lora_int_id: int = 0

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def total_len(self) -> int:
        """Prompt plus output tokens: the sequence length the request reaches when it finishes."""
        return len(self.prompt_token_ids) + self.output_len
