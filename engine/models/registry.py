"""Architecture names (config.json ``architectures``) -> model classes."""

from __future__ import annotations

from engine.models.config import ModelConfig
from engine.models.cohere import Cohere2ForCausalLM, CohereForCausalLM
from engine.models.deepseek import DeepseekV2ForCausalLM, DeepseekV3ForCausalLM
from engine.models.ernie4_5 import Ernie4_5ForCausalLM
from engine.models.exaone4 import Exaone4ForCausalLM
from engine.models.gemma import Gemma2ForCausalLM, Gemma3ForCausalLM
from engine.models.glm import Glm4ForCausalLM, GlmForCausalLM
from engine.models.glm4_moe import Glm4MoeForCausalLM
from engine.models.gpt_oss import GptOssForCausalLM
from engine.models.granite import GraniteForCausalLM
from engine.models.hunyuan import HunYuanDenseV1ForCausalLM
from engine.models.internlm3 import InternLM3ForCausalLM
from engine.models.llama import LlamaForCausalLM
from engine.models.llama4 import Llama4ForCausalLM
from engine.models.mistral import MistralForCausalLM
from engine.models.multimodal_text import MULTIMODAL_ARCHITECTURES
from engine.models.moe_model import MixtralForCausalLM, Qwen2MoeForCausalLM, Qwen3MoeForCausalLM
from engine.models.olmo2 import Olmo2ForCausalLM, Olmo3ForCausalLM
from engine.models.phi3 import Phi3ForCausalLM
from engine.models.qwen2 import Qwen2ForCausalLM
from engine.models.qwen3 import Qwen3ForCausalLM
from engine.models.seed_oss import SeedOssForCausalLM
from engine.models.sequence_classification import sequence_classifier
from engine.models.smollm3 import SmolLM3ForCausalLM
from engine.models.starcoder2 import Starcoder2ForCausalLM

MODEL_REGISTRY: dict[str, type[LlamaForCausalLM]] = {
    "LlamaForCausalLM": LlamaForCausalLM,
    "Qwen2ForCausalLM": Qwen2ForCausalLM,
    "MistralForCausalLM": MistralForCausalLM,
    "MixtralForCausalLM": MixtralForCausalLM,
    "Qwen2MoeForCausalLM": Qwen2MoeForCausalLM,
    "Qwen3ForCausalLM": Qwen3ForCausalLM,
    "Qwen3MoeForCausalLM": Qwen3MoeForCausalLM,
    "Gemma2ForCausalLM": Gemma2ForCausalLM,
    "Gemma3ForCausalLM": Gemma3ForCausalLM,
    "DeepseekV2ForCausalLM": DeepseekV2ForCausalLM,
    "DeepseekV3ForCausalLM": DeepseekV3ForCausalLM,
    "GptOssForCausalLM": GptOssForCausalLM,
    "Glm4MoeForCausalLM": Glm4MoeForCausalLM,
    "GlmForCausalLM": GlmForCausalLM,
    "SeedOssForCausalLM": SeedOssForCausalLM,
    "Exaone4ForCausalLM": Exaone4ForCausalLM,
    "Ernie4_5ForCausalLM": Ernie4_5ForCausalLM,
    "HunYuanDenseV1ForCausalLM": HunYuanDenseV1ForCausalLM,
    "InternLM3ForCausalLM": InternLM3ForCausalLM,
    "Glm4ForCausalLM": Glm4ForCausalLM,
    "GraniteForCausalLM": GraniteForCausalLM,
    "Phi3ForCausalLM": Phi3ForCausalLM,
    "Olmo2ForCausalLM": Olmo2ForCausalLM,
    "Olmo3ForCausalLM": Olmo3ForCausalLM,
    "CohereForCausalLM": CohereForCausalLM,
    "Cohere2ForCausalLM": Cohere2ForCausalLM,
    "SmolLM3ForCausalLM": SmolLM3ForCausalLM,
    "Starcoder2ForCausalLM": Starcoder2ForCausalLM,
    "Llama4ForCausalLM": Llama4ForCausalLM,
    # Multimodal checkpoints served as their language model, text in and out (multimodal_text.py); LLaVA's and
    # Mistral 3's text model is chosen by model_type below.
    "Llama4ForConditionalGeneration": Llama4ForCausalLM,
    "Gemma3ForConditionalGeneration": Gemma3ForCausalLM,
    "Mistral3ForConditionalGeneration": MistralForCausalLM,
    "LlavaForConditionalGeneration": LlamaForCausalLM,
    "LlavaNextForConditionalGeneration": LlamaForCausalLM,
    "LlavaOnevisionForConditionalGeneration": Qwen2ForCausalLM,
    "InternVLForConditionalGeneration": Qwen2ForCausalLM,
    "Qwen2VLForConditionalGeneration": Qwen2ForCausalLM,
    "Qwen2_5_VLForConditionalGeneration": Qwen2ForCausalLM,
    "Qwen3VLForConditionalGeneration": Qwen3ForCausalLM,
    "Qwen3VLMoeForConditionalGeneration": Qwen3MoeForCausalLM,
    # Base models saved without an LM head (transformers' AutoModel; e5-mistral-7b-instruct is a MistralModel):
    # their tensors lack the "model." prefix and lm_head.weight, so they can only embed (runner="pooling").
    "LlamaModel": LlamaForCausalLM,
    "MistralModel": MistralForCausalLM,
    "Qwen2Model": Qwen2ForCausalLM,
    "Qwen3Model": Qwen3ForCausalLM,
    # Classifiers and rerankers: the decoder with a score head in place of the LM head; they only classify.
    "LlamaForSequenceClassification": sequence_classifier(LlamaForCausalLM),
    "MistralForSequenceClassification": sequence_classifier(MistralForCausalLM),
    "Qwen2ForSequenceClassification": sequence_classifier(Qwen2ForCausalLM),
    "Qwen3ForSequenceClassification": sequence_classifier(Qwen3ForCausalLM),
}


def is_base_model(architecture: str) -> bool:
    """A ``*Model`` architecture: a checkpoint of the decoder alone, without an LM head."""
    return architecture.endswith("Model") and architecture in MODEL_REGISTRY


def supported_architectures() -> list[str]:
    return sorted(MODEL_REGISTRY)


# A multimodal checkpoint's language model, by its text_config's model_type (multimodal_text.py).
TEXT_MODEL_CLASSES: dict[str, type[LlamaForCausalLM]] = {
    "llama": LlamaForCausalLM, "mistral": MistralForCausalLM, "qwen2": Qwen2ForCausalLM, "qwen3": Qwen3ForCausalLM,
    "qwen3_moe": Qwen3MoeForCausalLM, "gemma3_text": Gemma3ForCausalLM, "llama4_text": Llama4ForCausalLM,
}


def get_model_class(config: ModelConfig) -> type[LlamaForCausalLM]:
    if config.architecture in MULTIMODAL_ARCHITECTURES:
        if config.model_type not in TEXT_MODEL_CLASSES:
            raise ValueError(f"{config.architecture}'s language model (text_config.model_type {config.model_type!r}) "
                             f"is not supported; supported: {', '.join(TEXT_MODEL_CLASSES)}")
        return TEXT_MODEL_CLASSES[config.model_type]
    try:
        return MODEL_REGISTRY[config.architecture]
    except KeyError:
        raise ValueError(
            f"unsupported model architecture {config.architecture!r} (config.json 'architectures'); "
            f"supported: {', '.join(supported_architectures())}") from None
