"""A vLLM-style inference engine: the shared core, the real runner and the front ends.

``from engine import LLM, SamplingParams, RequestOutput``. The front-end names are resolved lazily
(PEP 562): ``import engine.core`` must stay free of torch, because the simulator imports the core
in installs that have no torch at all.
"""

from engine.core.pooling_params import PoolingParams
from engine.core.sampling_params import SamplingParams
from engine.core.structured_outputs import StructuredOutputsParams

__all__ = ["LLM", "AsyncLLM", "SamplingParams", "PoolingParams", "StructuredOutputsParams", "RequestOutput",
           "CompletionOutput", "EmbeddingRequestOutput", "ClassificationRequestOutput", "ScoringRequestOutput",
           "EngineArgs", "BeamSearchParams"]

_LAZY = {
    "LLM": ("engine.llm", "LLM"),
    "AsyncLLM": ("engine.async_llm", "AsyncLLM"),
    "RequestOutput": ("engine.outputs", "RequestOutput"),
    "CompletionOutput": ("engine.outputs", "CompletionOutput"),
    "EngineArgs": ("engine.engine_args", "EngineArgs"),
    "BeamSearchParams": ("engine.beam_search", "BeamSearchParams"),
    "EmbeddingRequestOutput": ("engine.pooling_outputs", "EmbeddingRequestOutput"),
    "ClassificationRequestOutput": ("engine.pooling_outputs", "ClassificationRequestOutput"),
    "ScoringRequestOutput": ("engine.pooling_outputs", "ScoringRequestOutput"),
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        module_name, attribute = _LAZY[name]
        value = getattr(importlib.import_module(module_name), attribute)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'engine' has no attribute {name!r}")
