"""``RequestSpec``: one request of a generated workload, the same object for the simulator and the engine."""

from __future__ import annotations

from array import array
from dataclasses import dataclass, replace

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
    # Multi-turn sessions (workload.sessions): the conversation's later turns, each sent when the one before
    # it finishes (see ``next_turn``); empty for a request that ends its conversation or has none.
    next_turns: tuple[FollowUpTurn, ...] = ()
    # The session's first request's id and this request's turn in it (1 for the first); None / 1 without one.
    session_id: str | None = None
    turn: int = 1
    # Seconds the request waited at the client for a free slot (workload.max_concurrency) before it was sent at
    # ``arrival_time``; 0 for a request sent when it arrived.
    client_wait_s: float = 0.0
    # The images it shows (workload.images): (identifier, offset of its first placeholder token, placeholder
    # tokens), in prompt order; the engine's multimodal items (engine/core/multimodal.py). A session's later
    # turns resend them at the same offsets (the conversation starts with this prompt).
    images: tuple[tuple[str, int, int], ...] = ()

    def next_turn(self, conversation_token_ids: array, finish_time: float) -> RequestSpec:
        """The session's next turn, sent ``think_time_s`` after this request finished at ``finish_time``:
        its prompt is ``conversation_token_ids`` (this request's prompt and generated tokens) followed by the
        turn's own user tokens. Class, priority, prefix group and adapter stay the session's."""
        follow_up, *later = self.next_turns
        prompt = array("q", conversation_token_ids)
        prompt.extend(follow_up.user_token_ids)
        return replace(self, request_id=follow_up.request_id, arrival_time=finish_time + follow_up.think_time_s,
                       prompt_token_ids=prompt, output_len=follow_up.output_len, next_turns=tuple(later),
                       session_id=self.session_id or self.request_id, turn=self.turn + 1, client_wait_s=0.0)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def total_len(self) -> int:
        """Prompt plus output tokens: the sequence length the request reaches when it finishes."""
        return len(self.prompt_token_ids) + self.output_len


@dataclass(frozen=True, slots=True)
class FollowUpTurn:
    """A later turn of a session, known before the run except for when it is sent and what it resends.

    Its prompt length is known too (the generator caps sessions by it): the previous turn's prompt, plus
    that turn's ``output_len`` generated tokens (exact: ignore_eos), plus ``len(user_token_ids)``.
    """

    request_id: str
    user_token_ids: array
    output_len: int
    think_time_s: float


def count_requests(specs) -> int:
    """Every request the specs will send: each one and its sessions' later turns."""
    return sum(1 + len(spec.next_turns) for spec in specs)
