"""Small generated checkpoints (with tokenizers) and transformers references, shared by the engine and
runner tests. Generated into pytest's temporary directories: the tests never touch the user's cache."""

from __future__ import annotations

import copy
import random
import shutil
from pathlib import Path

import torch

from engine.models import default_model_path, make_test_model


def make_tiny_llama(tmp_path_factory) -> Path:
    """The project's default "tiny" Llama (GQA, untied head) with its byte-level BPE tokenizer."""
    return default_model_path("tiny", cache_dir=tmp_path_factory.mktemp("servesim-cache"))


def make_tiny_qwen2(tmp_path_factory) -> Path:
    """A tiny Qwen2 (q/k/v biases) with its own generated tokenizer."""
    return make_test_model(tmp_path_factory.mktemp("tiny-qwen2"), "qwen2", seed=3, with_tokenizer=True)


def load_hf_model(path: Path):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32, attn_implementation="eager")
    return model.eval()


def hf_greedy(hf_model, prompt: list[int], max_tokens: int) -> list[int]:
    """transformers' greedy generate for one prompt (no padding), never stopping early on EOS.

    EOS is switched off in a copy of the generation config rather than held back with min_new_tokens:
    min_new_tokens masks EOS out of the logits, while the engine's ignore_eos (as vLLM's) may still pick
    it and only does not stop there, so the two would differ wherever EOS is the argmax."""
    generation_config = copy.deepcopy(hf_model.generation_config)
    generation_config.eos_token_id = None
    with torch.no_grad():
        output = hf_model.generate(torch.tensor([prompt]), generation_config=generation_config,
                                   max_new_tokens=max_tokens, do_sample=False, pad_token_id=0)
    return output[0, len(prompt):].tolist()


def hf_logits(hf_model, token_ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return hf_model(torch.tensor([token_ids])).logits[0]


def mixed_prompts(vocab_size: int, seed: int = 0, num_prompts: int = 16) -> list[list[int]]:
    """Prompts of 3..70 tokens; every other one starts with one of two shared 32-token prefixes."""
    rng = random.Random(seed)
    prefixes = [[rng.randrange(4, vocab_size) for _ in range(32)] for _ in range(2)]
    prompts = []
    for index in range(num_prompts):
        tail = [rng.randrange(4, vocab_size) for _ in range(rng.randint(3, 38))]
        prompts.append(prefixes[index % 4 // 2] + tail if index % 2 == 0 else tail + tail[:rng.randint(0, 30)])
    return prompts


CLASSIFIER_LABELS = ["negative", "neutral", "positive"]


def save_classifier(source, target, num_labels: int, seed: int):
    """``source``'s decoder with a fresh score head of ``num_labels``, saved by transformers, with the tokenizer."""
    from transformers import AutoConfig, AutoModelForSequenceClassification

    config = AutoConfig.from_pretrained(str(source), num_labels=num_labels)
    if num_labels == len(CLASSIFIER_LABELS):
        config.id2label = dict(enumerate(CLASSIFIER_LABELS))
        config.label2id = {label: index for index, label in enumerate(CLASSIFIER_LABELS)}
    torch.manual_seed(seed)
    model = AutoModelForSequenceClassification.from_pretrained(str(source), config=config, dtype=torch.float32)
    model.save_pretrained(str(target))
    for name in source.iterdir():
        if name.name.startswith(("tokenizer", "special_tokens")):
            shutil.copy(name, target / name.name)
    return target
