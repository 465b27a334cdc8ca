"""Token sampling from logits: request-level processors, penalties, truncation, seeded draws, logprobs."""

from engine.runner.sampler.logprobs import LogprobsTensors, gather_logprobs
from engine.runner.sampler.metadata import SamplingMetadata, make_generator
from engine.runner.sampler.sampler import Sampler, SamplerOutput

__all__ = ["LogprobsTensors", "Sampler", "SamplerOutput", "SamplingMetadata", "gather_logprobs", "make_generator"]
