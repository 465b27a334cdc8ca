"""Properties, over drawn shapes and values, of what the new checkpoints' loading and routing compute: block-FP8
and MXFP4 dequantization against an element-by-element definition, and DeepSeek's grouped router's rules."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.models.block_fp8 import dequantize_block_fp8
from engine.models.config import MoEConfig
from engine.models.deepseek import DeepseekRouter
from engine.models.deepseek_config import DeepseekRouting
from engine.models.mxfp4 import E2M1_VALUES, dequantize_mxfp4

SETTINGS = settings(max_examples=40, deadline=None)


@SETTINGS
@given(rows=st.integers(1, 40), columns=st.integers(1, 40), block_rows=st.integers(1, 16),
       block_columns=st.integers(1, 16), seed=st.integers(0, 2**16))
def test_block_fp8_is_each_element_times_its_blocks_scale(rows, columns, block_rows, block_columns, seed):
    generator = torch.Generator().manual_seed(seed)
    weight = torch.randn(rows, columns, generator=generator).to(torch.float8_e4m3fn)
    scales = torch.rand(-(-rows // block_rows), -(-columns // block_columns), generator=generator) + 0.01
    out = dequantize_block_fp8(weight, scales, (block_rows, block_columns), torch.float32)
    for row in range(0, rows, max(1, rows // 4)):
        for column in range(0, columns, max(1, columns // 4)):
            expected = weight[row, column].float() * scales[row // block_rows, column // block_columns]
            assert out[row, column] == expected


@SETTINGS
@given(groups=st.integers(1, 4), leading=st.integers(1, 3), seed=st.integers(0, 2**16))
def test_mxfp4_is_each_code_times_its_blocks_power_of_two(groups, leading, seed):
    generator = torch.Generator().manual_seed(seed)
    blocks = torch.randint(0, 256, (leading, groups, 16), dtype=torch.uint8, generator=generator)
    scales = torch.randint(110, 140, (leading, groups), dtype=torch.uint8, generator=generator)
    out = dequantize_mxfp4(blocks, scales, torch.float32)
    assert out.shape == (leading, 32 * groups)
    for index in range(0, 32 * groups, 7):
        group, byte, high = index // 32, (index % 32) // 2, index % 2
        code = (int(blocks[0, group, byte]) >> (4 * high)) & 0x0F
        assert out[0, index] == E2M1_VALUES[code] * 2.0 ** (int(scales[0, group]) - 127)


@st.composite
def routers(draw):
    num_groups = draw(st.integers(1, 4))
    per_group = draw(st.integers(2, 5))
    top_k_groups = draw(st.integers(1, num_groups))
    top_k = draw(st.integers(1, top_k_groups * per_group))
    routing = DeepseekRouting(scoring=draw(st.sampled_from(["sigmoid", "softmax"])), num_groups=num_groups,
                              top_k_groups=top_k_groups, group_score=draw(st.sampled_from(["top2_sum", "max"])),
                              score_correction_bias=draw(st.booleans()),
                              routed_scaling_factor=draw(st.sampled_from([1.0, 2.5])))
    moe = MoEConfig(num_experts=num_groups * per_group, num_experts_per_token=top_k, expert_intermediate_size=4,
                    normalize_top_k=draw(st.booleans()), routing_weights_in_float32=True, deepseek_routing=routing)
    return moe, draw(st.integers(0, 2**16))


@SETTINGS
@given(drawn=routers())
def test_the_grouped_router_picks_distinct_experts_in_kept_groups_and_weighs_them_by_score(drawn):
    moe, seed = drawn
    routing, per_group = moe.deepseek_routing, moe.num_experts // moe.deepseek_routing.num_groups
    generator = torch.Generator().manual_seed(seed)
    router = DeepseekRouter(8, moe)
    with torch.no_grad():
        router.weight.copy_(torch.randn(moe.num_experts, 8, generator=generator))
        if router.e_score_correction_bias is not None:
            router.e_score_correction_bias.copy_(torch.randn(moe.num_experts, generator=generator))
    x = torch.randn(6, 8, generator=generator)
    with torch.no_grad():
        expert_ids, weights = router(x)
    logits = x @ router.weight.T
    scores = logits.sigmoid() if routing.scoring == "sigmoid" else logits.softmax(-1)
    choice = scores if router.e_score_correction_bias is None else scores + router.e_score_correction_bias
    grouped = choice.view(6, routing.num_groups, per_group)
    group_scores = grouped.topk(2, -1).values.sum(-1) if routing.group_score == "top2_sum" else grouped.max(-1).values
    for row in range(6):
        ids = expert_ids[row].tolist()
        assert len(set(ids)) == moe.num_experts_per_token
        kept = set(group_scores[row].topk(routing.top_k_groups).indices.tolist())
        assert {expert // per_group for expert in ids} <= kept
        # No expert of a kept group left out scores above one taken (the top-k among the kept groups).
        taken = min(choice[row, ids].tolist())
        for expert in range(moe.num_experts):
            if expert // per_group in kept and expert not in ids:
                assert choice[row, expert] <= taken + 1e-6
        chosen = scores[row, ids]
        if moe.normalize_top_k:
            chosen = chosen / chosen.sum()
        torch.testing.assert_close(weights[row], chosen * routing.routed_scaling_factor)
