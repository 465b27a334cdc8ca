"""What ``LLM.embed``, ``LLM.classify`` and ``LLM.score`` return, shaped like vLLM's ``EmbeddingRequestOutput`` /
``EmbeddingOutput``, ``ClassificationRequestOutput`` / ``ClassificationOutput`` and ``ScoringRequestOutput`` /
``ScoringOutput``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Generic, TypeVar

from engine.outputs import RequestOutput

PooledT = TypeVar("PooledT")


def pooled_values(output: RequestOutput, what: str) -> list[float]:
    """A finished pooling request's vector (its one placeholder token is dropped, as echo's is), or an error
    saying how the request ended without one."""
    if output.pooler_output is None:
        reason = output.outputs[0].finish_reason if output.outputs else None
        raise RuntimeError(f"request {output.request_id!r} ended ({reason}) without its {what}"
                           + (f": {output.status_message}" if output.status_message else ""))
    return list(output.pooler_output)


@dataclass(slots=True)
class PoolingRequestOutput(Generic[PooledT]):
    """vLLM's shape for every pooling task: the request, what was pooled for it, its prompt's token ids."""
    request_id: str
    outputs: PooledT
    prompt_token_ids: list[int]
    finished: bool = True

    # What a task's pooled vector is called in errors, and the output type it becomes (set by each task).
    what: ClassVar[str] = "pooled output"

    @classmethod
    def wrap(cls, values: list[float]) -> PooledT:
        raise NotImplementedError

    @classmethod
    def from_request_output(cls, output: RequestOutput):
        return cls(output.request_id, cls.wrap(pooled_values(output, cls.what)), list(output.prompt_token_ids))


@dataclass(slots=True)
class EmbeddingOutput:
    embedding: list[float]

    @property
    def hidden_size(self) -> int:
        return len(self.embedding)


@dataclass(slots=True)
class EmbeddingRequestOutput(PoolingRequestOutput[EmbeddingOutput]):
    what: ClassVar[str] = "embedding"

    @classmethod
    def wrap(cls, values: list[float]) -> EmbeddingOutput:
        return EmbeddingOutput(values)


@dataclass(slots=True)
class ClassificationOutput:
    """The labels' probabilities (softmax over the labels; a single label's sigmoid)."""
    probs: list[float]

    @property
    def num_classes(self) -> int:
        return len(self.probs)


@dataclass(slots=True)
class ClassificationRequestOutput(PoolingRequestOutput[ClassificationOutput]):
    what: ClassVar[str] = "classification"

    @classmethod
    def wrap(cls, values: list[float]) -> ClassificationOutput:
        return ClassificationOutput(values)


@dataclass(slots=True)
class ScoringOutput:
    score: float


@dataclass(slots=True)
class ScoringRequestOutput(PoolingRequestOutput[ScoringOutput]):
    """vLLM's: one score, and the token ids of both texts (the first's, then the second's)."""
