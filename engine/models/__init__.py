"""Model definitions for paged attention, checkpoint loading, and the offline default model."""

from engine.models.config import ModelConfig
from engine.models.default_model import default_model_path, make_test_model
from engine.models.llama import LlamaForCausalLM
from engine.models.loader import load_model, load_tokenizer
from engine.models.mistral import MistralForCausalLM
from engine.models.qwen2 import Qwen2ForCausalLM
from engine.models.qwen3 import Qwen3ForCausalLM
from engine.models.registry import MODEL_REGISTRY, get_model_class, supported_architectures

__all__ = [
    "MODEL_REGISTRY",
    "LlamaForCausalLM",
    "MistralForCausalLM",
    "ModelConfig",
    "Qwen2ForCausalLM",
    "Qwen3ForCausalLM",
    "default_model_path",
    "get_model_class",
    "load_model",
    "load_tokenizer",
    "make_test_model",
    "supported_architectures",
]
