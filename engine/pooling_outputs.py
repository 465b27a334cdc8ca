"""What ``LLM.embed`` and ``LLM.score`` return, shaped like vLLM's ``EmbeddingRequestOutput`` / ``EmbeddingOutput``
and ``ScoringRequestOutput`` / ``ScoringOutput``."""

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
        """The embedding of a finished pooling request; its one placeholder token is dropped, as echo's is."""
        if output.pooler_output is None:
            reason = output.outputs[0].finish_reason if output.outputs else None
            raise RuntimeError(f"request {output.request_id!r} ended ({reason}) without its embedding"
                               + (f": {output.status_message}" if output.status_message else ""))
        return cls(output.request_id, EmbeddingOutput(list(output.pooler_output)), list(output.prompt_token_ids))


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
