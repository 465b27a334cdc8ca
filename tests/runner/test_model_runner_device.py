"""Device, attention backend and dtype selection; the CUDA path runs where a GPU exists and is skipped
cleanly elsewhere, with clear errors when CUDA or flash-attn is asked for but unusable."""

import logging

import pytest
import torch

from engine.runner import config as runner_config
from engine.runner.config import resolve_attention_backend, resolve_device, resolve_runtime_dtype
from kernels import triton_support

HAVE_CUDA = torch.cuda.is_available()
HAVE_FLASH_ATTN = HAVE_CUDA and runner_config.flash_attn_importable()


def test_defaults_on_cpu():
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_attention_backend(None, torch.device("cpu")) == "torch"
    assert resolve_runtime_dtype("auto", torch.float32, "torch") == torch.float32


def test_cuda_default_backend(monkeypatch, caplog):
    cuda = torch.device("cuda")
    monkeypatch.setattr(runner_config, "flash_attn_importable", lambda: True)
    assert resolve_attention_backend(None, cuda) == "flash_attn"
    monkeypatch.setattr(runner_config, "flash_attn_importable", lambda: False)
    # Without flash-attn: the triton backend where its kernels can launch, else torch with a warning.
    monkeypatch.setattr(triton_support, "triton_unavailable_reason", lambda: None)
    assert resolve_attention_backend(None, cuda) == "triton"
    monkeypatch.setattr(triton_support, "triton_unavailable_reason", lambda: "the triton package is not installed")
    with caplog.at_level(logging.WARNING):
        assert resolve_attention_backend(None, cuda) == "torch"
    assert "neither flash-attn nor triton can run here (the triton package is not installed)" in caplog.text
    # flash-attn has no float32 kernels: "auto" runs a float32 checkpoint in bfloat16, float32 is refused.
    assert resolve_runtime_dtype("auto", torch.float32, "flash_attn") == torch.bfloat16
    assert resolve_runtime_dtype("auto", torch.float16, "flash_attn") == torch.float16
    with pytest.raises(ValueError, match="float16/bfloat16"):
        resolve_runtime_dtype("float32", torch.float32, "flash_attn")


@pytest.mark.skipif(HAVE_CUDA, reason="CUDA is available here")
def test_clear_errors_without_cuda(tiny_llama_path):
    from engine import LLM

    # ValueError, like any bad setting: the CLIs turn it into one line and exit code 2, not a traceback.
    with pytest.raises(ValueError, match="CUDA is not available"):
        LLM(model=str(tiny_llama_path), device="cuda")
    with pytest.raises(ValueError, match="attention_backend 'flash_attn' needs device='cuda'"):
        LLM(model=str(tiny_llama_path), attention_backend="flash_attn")


@pytest.mark.skipif(not HAVE_CUDA, reason="needs a CUDA device")
def test_cuda_torch_backend_matches_transformers(tiny_llama_path):
    from engine import LLM, SamplingParams
    from tests.engine.model_fixtures import hf_greedy, load_hf_model, mixed_prompts

    hf_model = load_hf_model(tiny_llama_path)
    prompts = mixed_prompts(hf_model.config.vocab_size, seed=11, num_prompts=8)
    # A pool sized for the test: from the memory budget, the tiny model gets millions of blocks on a
    # large GPU, and building their bookkeeping takes seconds of the GPU check's budget.
    llm = LLM(model=str(tiny_llama_path), device="cuda", attention_backend="torch", dtype="float32",
              max_num_seqs=8, max_num_batched_tokens=48, num_gpu_blocks=256)
    outputs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True), use_tqdm=False)
    for prompt, output in zip(prompts, outputs):
        assert output.outputs[0].token_ids == hf_greedy(hf_model, prompt, 6)


@pytest.mark.skipif(not HAVE_CUDA, reason="needs a CUDA device")
@pytest.mark.parametrize("architecture", ["qwen2", "qwen3", "mixtral", "qwen2_moe", "qwen3_moe"])
def test_cuda_architectures_match_transformers(architecture, tmp_path):
    """Each family's own parts on the device (Qwen's biases, Qwen3's per-head q/k norms, the experts' routing,
    Qwen2-MoE's shared expert): greedy tokens equal transformers' (float32 on the CPU), with the engine in
    float32 on CUDA, prefill chunked beside decodes, and every block back at the end."""
    from engine import LLM, SamplingParams
    from engine.models import make_test_model
    from tests.engine.model_fixtures import hf_greedy, load_hf_model, mixed_prompts

    head_dim = {"qwen3": 32, "qwen3_moe": 24}.get(architecture)
    path = make_test_model(tmp_path / architecture, architecture, head_dim=head_dim, seed=5)
    hf_model = load_hf_model(path)
    prompts = mixed_prompts(hf_model.config.vocab_size, seed=13, num_prompts=6)
    llm = LLM(model=str(path), skip_tokenizer_init=True, device="cuda", attention_backend="torch", dtype="float32",
              max_num_seqs=6, max_num_batched_tokens=40, num_gpu_blocks=128)
    outputs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True), use_tqdm=False)
    for prompt, output in zip(prompts, outputs):
        assert output.outputs[0].token_ids == hf_greedy(hf_model, prompt, 6)
    manager = llm.scheduler.kv_cache_manager
    assert manager.num_free_blocks == manager.num_usable_blocks


@pytest.mark.skipif(not HAVE_FLASH_ATTN, reason="needs CUDA and flash-attn")
def test_cuda_flash_attn_matches_torch_backend(tiny_llama_path):
    """Same device and dtype, two backends: the first step's logits agree to bfloat16 precision."""
    from engine import LLM, SamplingParams
    from tests.engine.model_fixtures import mixed_prompts

    prompts = mixed_prompts(512, seed=11, num_prompts=8)
    params = SamplingParams(temperature=0.0, max_tokens=1, logprobs=5)
    results = {}
    for backend in ("flash_attn", "torch"):
        llm = LLM(model=str(tiny_llama_path), device="cuda", attention_backend=backend, dtype="bfloat16",
                  max_num_seqs=8)
        assert llm.model_runner.attention_backend == backend
        outputs = llm.generate(prompts, params, use_tqdm=False)
        results[backend] = [o.outputs[0].logprobs[0] for o in outputs]
        manager = llm.scheduler.kv_cache_manager
        assert manager.num_free_blocks == manager.num_usable_blocks
    for flash, reference in zip(results["flash_attn"], results["torch"]):
        common = set(flash) & set(reference)
        assert common
        for token_id in common:
            assert flash[token_id].logprob == pytest.approx(reference[token_id].logprob, abs=5e-2)



@pytest.mark.parametrize("device", ["gpu", "xyz", "mps", "cuda:zero"])
def test_a_device_this_engine_lacks_is_a_value_error_naming_it(device):
    with pytest.raises(ValueError, match=f"device must be 'cpu' or 'cuda', got '{device}'"):
        resolve_device(device)


def test_an_attention_backend_that_cannot_run_here_is_a_value_error(monkeypatch):
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    monkeypatch.setattr(triton_support, "triton_unavailable_reason", lambda: "the triton package is not installed")
    with pytest.raises(ValueError, match="attention_backend 'triton' cannot run here: the triton package"):
        resolve_attention_backend("triton", cpu)
    monkeypatch.setattr(runner_config, "flash_attn_importable", lambda: False)
    with pytest.raises(ValueError, match="flash-attn package is not installed"):
        resolve_attention_backend("flash_attn", cuda)
    with pytest.raises(ValueError, match=r"attention_backend must be one of \['flash_attn', 'torch', 'triton'\]"):
        resolve_attention_backend("flash", cpu)
    monkeypatch.setattr(triton_support, "triton_unavailable_reason", lambda: None)
    assert resolve_attention_backend("triton", cpu) == "triton"
