"""What ``LLM.embed``, ``LLM.classify`` and ``LLM.score`` return, shaped like vLLM's ``EmbeddingRequestOutput`` /
``EmbeddingOutput``, ``ClassificationRequestOutput`` / ``ClassificationOutput`` and ``ScoringRequestOutput`` /
``ScoringOutput``."""

from __future__ import annotations

from dataclasses import dataclass

from engine.outputs import RequestOutput


@dataclass(slots=True)
class EmbeddingOutput:
    embedding: list[float]

    @property
    def hidden_size(self) -> int:
        return len(self.embedding)


@dataclass(slots=True)
class EmbeddingRequestOutput:
    request_id: str
    outputs: EmbeddingOutput
    prompt_token_ids: list[int]
    finished: bool = True

    @classmethod
    def from_request_output(cls, output: RequestOutput) -> "EmbeddingRequestOutput":
        return cls(output.request_id, EmbeddingOutput(pooled_values(output, "embedding")), list(output.prompt_token_ids))


def pooled_values(output: RequestOutput, what: str) -> list[float]:
    """A finished pooling request's vector (its one placeholder token is dropped, as echo's is), or an error
    saying how the request ended without one."""
    if output.pooler_output is None:
        reason = output.outputs[0].finish_reason if output.outputs else None
        raise RuntimeError(f"request {output.request_id!r} ended ({reason}) without its {what}"
                           + (f": {output.status_message}" if output.status_message else ""))
    return list(output.pooler_output)


@dataclass(slots=True)
class ClassificationOutput:
    """The labels' probabilities (softmax over the labels; a single label's sigmoid)."""
    probs: list[float]

    @property
    def num_classes(self) -> int:
        return len(self.probs)


@dataclass(slots=True)
class ClassificationRequestOutput:
    request_id: str
    outputs: ClassificationOutput
    prompt_token_ids: list[int]
    finished: bool = True

    @classmethod
    def from_request_output(cls, output: RequestOutput) -> "ClassificationRequestOutput":
        return cls(output.request_id, ClassificationOutput(pooled_values(output, "classification")),
                   list(output.prompt_token_ids))


@dataclass(slots=True)
class ScoringOutput:
    score: float


@dataclass(slots=True)
class ScoringRequestOutput:
    """vLLM's: one score, and the token ids of both texts (the first's, then the second's)."""
    request_id: str
    outputs: ScoringOutput
    prompt_token_ids: list[int]
    finished: bool = True
