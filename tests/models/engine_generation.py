"""Shared by the model tests: the engine's greedy tokens through the scheduler against transformers' generate on
the same checkpoint, a CUDA engine's tokens against the CPU's, and checkpoints transformers itself writes."""

import random

import torch


def prompts(count: int = 3, length: int = 30) -> list[list[int]]:
    return [random_prompt(seed, length) for seed in range(count)]


def random_prompt(seed: int, length: int) -> list[int]:
    """``length`` token ids in [4, 500) from ``seed``: the same prompt in every run."""
    rng = random.Random(seed)
    return [rng.randrange(4, 500) for _ in range(length)]


def engine_and_transformers(path):
    """The engine's model and config of the checkpoint at ``path`` and transformers' (eager attention), in float32."""
    from transformers import AutoModelForCausalLM

    from engine.models import load_model

    model, config = load_model(path, torch.float32, "cpu")
    hf_model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32,
                                                    attn_implementation="eager").eval()
    return model, config, hf_model


def assert_engine_generates_as_transformers(path, token_prompts: list[list[int]], max_tokens: int = 8,
                                            hf_options: dict | None = None, **llm_options):
    """Greedy tokens of ``LLM(model=path, **llm_options)`` equal transformers' ``generate`` (its model loaded with
    ``hf_options`` besides); the engine is returned for the caller's own checks (preemptions, blocks)."""
    from transformers import AutoModelForCausalLM

    from engine import LLM, SamplingParams

    llm = LLM(model=str(path), skip_tokenizer_init=True, **llm_options)
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    outputs = [output.outputs[0].token_ids for output in llm.generate(token_prompts, params, use_tqdm=False)]
    hf = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32, attn_implementation="eager",
                                              **(hf_options or {})).eval()
    for prompt, tokens in zip(token_prompts, outputs):
        with torch.no_grad():
            expected = hf.generate(torch.tensor([prompt]), max_new_tokens=max_tokens, do_sample=False,
                                   min_new_tokens=max_tokens, pad_token_id=0)[0, len(prompt):]
        assert list(tokens) == expected.tolist()
    return llm


def assert_cuda_generates_the_cpu_tokens(path):
    """A CUDA engine's greedy tokens equal a CPU engine's; the CUDA engine is returned."""
    from engine import LLM, SamplingParams

    token_prompts = prompts(length=40)
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    options = dict(model=str(path), skip_tokenizer_init=True, dtype="float32", max_model_len=64)
    cpu = LLM(**options, device="cpu").generate(token_prompts, params, use_tqdm=False)
    gpu_engine = LLM(**options, device="cuda")
    gpu = gpu_engine.generate(token_prompts, params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in gpu] == [o.outputs[0].token_ids for o in cpu]
    return gpu_engine


def save_random(model, path, seed: int = 0):
    """A transformers model with its weights (norms left at their start) drawn N(0, 0.05), saved by transformers in
    its own layout: a checkpoint whose logits move enough for the comparisons to mean something."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "norm" not in name:
                parameter.normal_(0.0, 0.05)
    model.save_pretrained(str(path))
    return path
