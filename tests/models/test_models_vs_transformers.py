"""Our paged-attention models reproduce transformers' logits for the same checkpoints (fp32, CPU).

Each case runs prefills of several prompts as one batch with distinct, shuffled block tables, then a
chunked prefill (second chunk with nonzero context) mixed with single-token decodes, and compares every
produced logit row with transformers' forward over the whole sequence.
"""

import random

import pytest
import torch

from engine.models import default_model_path, load_model, make_test_model
from engine.runner.attention import allocate_kv_caches, build_attention_metadata, compute_positions
from tests.models.local_metadata import local_metadata

ATOL = 1e-4
BLOCK_SIZE = 16


class PagedSession:
    """Drives a model through steps with a paged cache, the way the runner will (minus the scheduler).
    ``attention_chunk``: a Llama 4's chunk, whose layers read the step's local-attention metadata as the runner
    builds it."""

    def __init__(self, model, config, num_blocks=64, block_size=BLOCK_SIZE, seed=0, attention_chunk=None):
        self.model, self.block_size, self.attention_chunk = model, block_size, attention_chunk
        self.kv_caches = allocate_kv_caches(config.num_hidden_layers, num_blocks, block_size,
                                            config.num_key_value_heads, config.head_dim, torch.float32, "cpu",
                                            value_head_size=config.value_head_dim)
        for key_cache, value_cache in self.kv_caches:  # unwritten slots must never matter
            key_cache.fill_(float("nan"))
            value_cache.fill_(float("nan"))
        self.free_blocks = list(range(num_blocks))
        random.Random(seed).shuffle(self.free_blocks)
        self.blocks: dict[str, list[int]] = {}
        self.num_computed: dict[str, int] = {}

    def step(self, chunks: dict[str, list[int]]) -> dict[str, torch.Tensor]:
        """Run one step over {request: new token ids}; returns each request's logits for those tokens."""
        names = list(chunks)
        for name in names:
            self.num_computed.setdefault(name, 0)
            blocks = self.blocks.setdefault(name, [])
            needed = -(-(self.num_computed[name] + len(chunks[name])) // self.block_size)
            while len(blocks) < needed:
                blocks.append(self.free_blocks.pop())
        computed = [self.num_computed[n] for n in names]
        scheduled = [len(chunks[n]) for n in names]
        metadata = build_attention_metadata(computed, scheduled, [self.blocks[n] for n in names], self.block_size)
        if self.attention_chunk:
            metadata.local = local_metadata(computed, scheduled, [self.blocks[n] for n in names], self.block_size,
                                            self.attention_chunk)
        positions = compute_positions(computed, scheduled)
        input_ids = torch.tensor([t for n in names for t in chunks[n]])
        with torch.no_grad():
            hidden = self.model(input_ids, positions, self.kv_caches, metadata)
            logits = self.model.compute_logits(hidden)
        out = {}
        for i, name in enumerate(names):
            start, end = metadata.query_start_loc_cpu[i], metadata.query_start_loc_cpu[i + 1]
            out[name] = logits[start:end]
            self.num_computed[name] += scheduled[i]
        return out


def hf_logits(hf_model, token_ids):
    with torch.no_grad():
        return hf_model(torch.tensor([token_ids])).logits[0]


def _variants():
    return {
        "llama": dict(architecture="llama"),
        "qwen2": dict(architecture="qwen2"),
        "mistral": dict(architecture="mistral"),
        "llama_tied": dict(architecture="llama", tie_word_embeddings=True),
        "llama3_rope": dict(architecture="llama", rope_theta=500000.0,
                            rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                          "high_freq_factor": 4.0, "original_max_position_embeddings": 64}),
        "linear_rope": dict(architecture="llama", rope_scaling={"type": "linear", "factor": 2.0}),
        # Mixtures of experts: router, top-k, the experts' weighted sum (and Qwen2-MoE's shared expert).
        "mixtral": dict(architecture="mixtral"),
        "qwen2_moe": dict(architecture="qwen2_moe"),
        "qwen2_moe_normalized": dict(architecture="qwen2_moe", norm_topk_prob=True, num_experts=8,
                                     num_experts_per_token=3),
        # Qwen3: per-head q/k norms (weights drawn apart from 1), heads wider than hidden_size / num_heads.
        "qwen3": dict(architecture="qwen3", head_dim=32),
        "qwen3_moe": dict(architecture="qwen3_moe", norm_topk_prob=True, num_experts=8, num_experts_per_token=3),
        "yarn_rope": dict(architecture="qwen2", rope_scaling={"rope_type": "yarn", "factor": 4.0,
                                                              "original_max_position_embeddings": 32}),
        # Multi-head latent attention over one cached latent, absorbed (transformers expands it per head), and
        # DeepSeek's routers: V3's sigmoid with a correction bias and groups, V2's softmax with groups.
        "deepseek_v3": dict(architecture="deepseek_v3"),
        "deepseek_v2": dict(architecture="deepseek_v2"),
        # Queries from one projection (V2-Lite), YaRN with DeepSeek's softmax-scale correction, rotate-half RoPE.
        "deepseek_v3_yarn": dict(architecture="deepseek_v3", config_overrides={
            "q_lora_rank": None, "rope_interleave": False,
            "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32, "mscale": 1.0,
                             "mscale_all_dim": 0.8, "beta_fast": 32, "beta_slow": 1}}),
        # gpt-oss: attention sinks, every other layer in an 8-token window, biased clamped-SwiGLU experts, and its
        # default YaRN (not truncated).
        "gpt_oss": dict(architecture="gpt_oss"),
        # Phi-3/Phi-4: q/k/v and gate/up stored fused; a window on every layer and RoPE on half of each head.
        "phi3": dict(architecture="phi3"),
        "phi3_partial_rope_window": dict(architecture="phi3", config_overrides={"sliding_window": 12,
                                                                                "partial_rotary_factor": 0.5}),
        # Granite: scaled embeddings, residual branches and logits; its own attention scale.
        "granite": dict(architecture="granite"),
        # OLMo 2: norms after each block, q and k normalized over the whole projection (weights drawn apart from 1).
        "olmo2": dict(architecture="olmo2"),
        # OLMo 3: OLMo 2 with three layers in four windowed; YaRN on the full layer only, plain RoPE on the others.
        "olmo3": dict(architecture="olmo3", num_hidden_layers=4, rope_theta=500000.0,
                      rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32}),
        # GLM-4 and GLM-4-0414: RoPE on half of each head by interleaved pairs, q/k/v biases, gate/up stored fused;
        # GLM-4-0414 normalizes each block's output too.
        "glm": dict(architecture="glm"),
        "glm4": dict(architecture="glm4"),
        # EXAONE 4.0: OLMo 2's blocks with per-head q/k norms; windowed layers with RoPE, the fourth full without; and
        # the 1.2B's layout, no window and RoPE everywhere.
        "exaone4": dict(architecture="exaone4", num_hidden_layers=4),
        "exaone4_no_window": dict(architecture="exaone4", config_overrides={"sliding_window": None,
                                                                            "layer_types": ["full_attention"] * 2}),
        # ERNIE 4.5: interleaved RoPE in float32, biases on every projection (use_bias), tied embeddings.
        "ernie4_5": dict(architecture="ernie4_5", tie_word_embeddings=True),
        # Hunyuan dense: per-head q/k norms after RoPE, RoPE's base stretched by NTK-alpha (rope_scaling dynamic).
        "hunyuan": dict(architecture="hunyuan_v1_dense", config_overrides={
            "rope_scaling": {"type": "dynamic", "alpha": 1000.0, "factor": 1.0}}),
        # InternLM3 (transformers runs it as Llama): biases on q, k, v, o and the MLP.
        "internlm3": dict(architecture="internlm3"),
        # Seed-OSS: q/k/v biases and the output projection's, each by its own switch.
        "seed_oss": dict(architecture="seed_oss"),
        # Cohere: LayerNorm, parallel attention + MLP, interleaved RoPE, scaled logits; and Command-R+'s q/k norms.
        "cohere": dict(architecture="cohere"),
        "cohere_qk_norm": dict(architecture="cohere", tie_word_embeddings=True, config_overrides={"use_qk_norm": True}),
        # Layers without RoPE: Cohere2's full-attention layer among windowed ones; SmolLM3's every fourth, and with
        # use_sliding_window its NoPE layers windowed.
        "cohere2": dict(architecture="cohere2", num_hidden_layers=4),
        "smollm3": dict(architecture="smollm3", num_hidden_layers=4),
        "smollm3_windows": dict(architecture="smollm3", num_hidden_layers=4,
                                config_overrides={"use_sliding_window": True, "sliding_window": 8}),
        # GLM-4.5: grouped-query attention with RoPE on half of each head, DeepSeek-V3's experts; with q/k norms.
        "glm4_moe": dict(architecture="glm4_moe", num_hidden_layers=3),
        "glm4_moe_qk_norm": dict(architecture="glm4_moe", num_hidden_layers=3, config_overrides={"use_qk_norm": True}),
        # StarCoder2: biases everywhere, LayerNorms, a plain tanh-GELU MLP; a window on every layer.
        "starcoder2": dict(architecture="starcoder2", tie_word_embeddings=True),
        "starcoder2_window": dict(architecture="starcoder2", config_overrides={"sliding_window": 12}),
    }


@pytest.fixture(scope="module", params=["default_tiny"] + list(_variants()))
def model_pair(request, tmp_path_factory):
    from transformers import AutoModelForCausalLM

    if request.param == "default_tiny":
        path = default_model_path("tiny", cache_dir=tmp_path_factory.mktemp("cache"))
    else:
        path = make_test_model(tmp_path_factory.mktemp(request.param), seed=7, **_variants()[request.param])
    model, config = load_model(path, torch.float32, "cpu")
    hf_model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32, attn_implementation="eager")
    hf_model.eval()
    return model, config, hf_model


def _prompt(seed, length, vocab_size):
    rng = random.Random(seed)
    return [rng.randrange(4, vocab_size) for _ in range(length)]


def test_batched_prefill_matches(model_pair):
    model, config, hf_model = model_pair
    prompts = {f"r{n}": _prompt(n, n, config.vocab_size) for n in (1, 7, 16, 33, 50)}
    session = PagedSession(model, config)
    logits = session.step(prompts)
    for name, tokens in prompts.items():
        torch.testing.assert_close(logits[name], hf_logits(hf_model, tokens), atol=ATOL, rtol=0, msg=name)


def test_chunked_prefill_and_decodes_match(model_pair):
    model, config, hf_model = model_pair
    long_seq = _prompt(100, 45, config.vocab_size)
    short_seq = _prompt(101, 12, config.vocab_size)
    expected_long, expected_short = hf_logits(hf_model, long_seq), hf_logits(hf_model, short_seq)
    session = PagedSession(model, config, seed=3)

    # Step 1: first chunk of the long prompt beside the whole short prompt.
    out = session.step({"long": long_seq[:21], "short": short_seq[:9]})
    torch.testing.assert_close(out["long"], expected_long[:21], atol=ATOL, rtol=0)
    torch.testing.assert_close(out["short"], expected_short[:9], atol=ATOL, rtol=0)
    # Step 2: second chunk (context 21, crossing a block boundary) beside a decode.
    out = session.step({"short": short_seq[9:10], "long": long_seq[21:40]})
    torch.testing.assert_close(out["long"], expected_long[21:40], atol=ATOL, rtol=0)
    torch.testing.assert_close(out["short"], expected_short[9:10], atol=ATOL, rtol=0)
    # Steps 3..: single-token decodes of both.
    for offset in range(5):
        chunks = {"long": [long_seq[40 + offset]]}
        if 10 + offset < len(short_seq):
            chunks["short"] = [short_seq[10 + offset]]
        out = session.step(chunks)
        torch.testing.assert_close(out["long"], expected_long[40 + offset:41 + offset], atol=ATOL, rtol=0)
        if "short" in out:
            torch.testing.assert_close(out["short"], expected_short[10 + offset:11 + offset], atol=ATOL, rtol=0)


def test_greedy_generation_matches_transformers_generate(model_pair):
    from engine.core.sampling_params import SamplingParams
    from engine.runner.sampler import Sampler, SamplingMetadata

    model, config, hf_model = model_pair
    prompts = {"a": _prompt(200, 11, config.vocab_size), "b": _prompt(201, 3, config.vocab_size)}
    num_new = 8
    session, sampler = PagedSession(model, config, seed=5), Sampler()
    # min_tokens / min_new_tokens on both sides: neither may stop early on EOS.
    params = [SamplingParams(temperature=0.0, max_tokens=num_new, min_tokens=num_new)] * 2
    outputs = {name: [] for name in prompts}
    chunks = dict(prompts)
    for _ in range(num_new):
        logits = session.step(chunks)
        last = torch.stack([logits[name][-1] for name in prompts])
        metadata = SamplingMetadata.from_requests(params, [outputs[n] for n in prompts],
                                                  eos_token_id=config.eos_token_id, vocab_size=config.vocab_size)
        for name, token in zip(prompts, sampler(last, metadata).sampled_token_ids.tolist()):
            outputs[name].append(token)
        chunks = {name: [outputs[name][-1]] for name in prompts}
    for name, prompt in prompts.items():
        with torch.no_grad():
            expected = hf_model.generate(torch.tensor([prompt]), max_new_tokens=num_new, do_sample=False,
                                         min_new_tokens=num_new, pad_token_id=0)[0, len(prompt):]
        assert outputs[name] == expected.tolist(), name
