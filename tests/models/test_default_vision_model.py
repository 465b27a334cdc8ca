"""The generated LLaVAs (engine/models/default_vision_model.py): complete Hugging Face folders that transformers reads
and runs to the engine's tokens with an image, whose tokenizer marks images with the vocabulary's last id and whose
chat template walks content parts; the simulator's presets describe them exactly."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch

from engine import LLM, SamplingParams
from engine.models import default_model_path
from engine.models.default_model import DEFAULT_MODEL_SPECS
from engine.models.default_vision_model import VISION_MODEL_SPECS


@pytest.fixture(scope="module")
def tiny_llava(tmp_path_factory):
    return default_model_path("tiny-llava", cache_dir=tmp_path_factory.mktemp("servesim-cache"))


def test_the_tiny_llava_runs_in_transformers_as_in_the_engine(tiny_llava, tmp_path):
    from transformers import AutoImageProcessor, AutoTokenizer, LlavaForConditionalGeneration

    config = json.loads((tiny_llava / "config.json").read_text())
    assert config["architectures"] == ["LlavaForConditionalGeneration"] and config["image_token_index"] == 511
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_llava))
    assert tokenizer.convert_tokens_to_ids("<image>") == 511 and len(tokenizer) == 512
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": [{"type": "image"},
                                                                            {"type": "text", "text": "what?"}]}],
                                             tokenize=False, add_generation_prompt=True)
    assert rendered == "<s>user:<image> what?\nassistant:"
    picture = np.random.RandomState(0).randint(0, 256, (70, 90, 3), dtype=np.uint8)
    llm = LLM(model=str(tiny_llava), dtype="float32")
    output = llm.generate([{"prompt": rendered, "multi_modal_data": {"image": picture}}],
                          SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True), use_tqdm=False)[0]
    assert output.prompt_token_ids.count(511) == 16
    hf = LlavaForConditionalGeneration.from_pretrained(str(tiny_llava), dtype=torch.float32,
                                                       attn_implementation="eager").eval()
    pixels = AutoImageProcessor.from_pretrained(str(tiny_llava))(images=[picture], return_tensors="pt")["pixel_values"]
    ids = torch.tensor([output.prompt_token_ids])
    with torch.no_grad():
        expected = hf.generate(input_ids=ids, pixel_values=pixels, max_new_tokens=6, min_new_tokens=6,
                               do_sample=False, pad_token_id=0)[0, ids.shape[1]:]
    assert list(output.outputs[0].token_ids) == expected.tolist()
    # The same name, the same folder: generated once, found again.
    assert default_model_path("tiny-llava", cache_dir=tiny_llava.parents[1]) == tiny_llava


def test_the_simulator_presets_describe_the_generated_llavas(tiny_llava):
    from sim.hf_vision_config import vision_encoder_from_hf_path
    from sim.model_presets import resolve_model
    from sim.vision_encoders import resolve_vision_encoder

    for size, spec in VISION_MODEL_SPECS.items():
        text, vision = DEFAULT_MODEL_SPECS[spec["text"]], spec["vision"]
        shape = resolve_model(f"servesim-{size}")
        assert (shape.num_layers, shape.hidden_size, shape.vocab_size) == (
            text["num_hidden_layers"], text["hidden_size"], text["vocab_size"])
        assert resolve_model(size) is shape
        encoder = resolve_vision_encoder(size, None)
        width = text["hidden_size"]
        assert (encoder.num_layers, encoder.hidden_size, encoder.intermediate_size, encoder.num_attention_heads,
                encoder.tokens_per_image, encoder.projector_parameters) == (
            vision["num_hidden_layers"] - 1, vision["hidden_size"], vision["intermediate_size"],
            vision["num_attention_heads"], (vision["image_size"] // vision["patch_size"]) ** 2,
            vision["hidden_size"] * width + width * width)
    # What the simulator reads from the generated config.json is the preset, field for field.
    read = vision_encoder_from_hf_path(tiny_llava)
    assert dataclasses.replace(read, name="servesim-tiny-clip") == resolve_vision_encoder("tiny-llava", None)


def test_llm_chat_takes_images_as_pil_parts_or_data_urls(tiny_llava):
    import base64
    import io

    from PIL import Image

    picture = Image.fromarray(np.random.RandomState(1).randint(0, 256, (60, 60, 3), dtype=np.uint8))
    buffer = io.BytesIO()
    picture.save(buffer, format="PNG")
    url = "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()
    llm = LLM(model=str(tiny_llava), dtype="float32")
    params = SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True)
    outputs = llm.chat([[{"role": "user", "content": [{"type": "image_pil", "image_pil": picture},
                                                       {"type": "text", "text": "describe"}]}],
                        [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                                      {"type": "text", "text": "describe"}]}]],
                       params, use_tqdm=False)
    assert outputs[0].prompt_token_ids == outputs[1].prompt_token_ids and outputs[0].prompt_token_ids.count(511) == 16
    expected = llm.generate([{"prompt_token_ids": outputs[0].prompt_token_ids, "multi_modal_data": {"image": picture}}],
                            params, use_tqdm=False)[0]
    assert outputs[0].outputs[0].token_ids == outputs[1].outputs[0].token_ids == expected.outputs[0].token_ids
    with pytest.raises(ValueError, match=r"messages\[0\].content\[0\].image_url.url: only data: URLs"):
        llm.chat([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "https://x/cat.png"}}]}],
                 params, use_tqdm=False)
    with pytest.raises(ValueError, match=r"messages\[0\].content\[1\] must be a text, image_url or image_pil part"):
        llm.chat([{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "video"}]}], params,
                 use_tqdm=False)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_images_on_cuda_give_the_cpu_tokens(tiny_llava):
    """The encoder on the GPU, its outputs kept there, steps with placeholders eager beside graph decodes."""
    pytest.importorskip("PIL", reason="a GPU image without Pillow (the real extra's) cannot prepare images")
    prompts = [{"prompt_token_ids": [1, 40 + seed, 511, 50 + seed, 60], "multi_modal_data": {
        "image": np.random.RandomState(seed).randint(0, 256, (64, 64, 3), dtype=np.uint8)}} for seed in range(3)]
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    options = dict(model=str(tiny_llava), dtype="float32", max_model_len=256, max_num_batched_tokens=24)
    cpu = LLM(**options, device="cpu").generate(prompts, params, use_tqdm=False)
    gpu = LLM(**options, device="cuda").generate(prompts, params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in gpu] == [o.outputs[0].token_ids for o in cpu]


def test_images_with_speculative_decoding_and_parallel_samples(tiny_llava):
    """n-gram drafts verified over an image prompt keep plain decoding's greedy tokens; a prompt's n samples share
    one encoding of its image (its children share the prompt's blocks)."""
    picture = np.random.RandomState(0).randint(0, 256, (64, 64, 3), dtype=np.uint8)
    request = {"prompt_token_ids": [1, 5, 511, 6, 7], "multi_modal_data": {"image": picture}}
    greedy = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    speculating = LLM(model=str(tiny_llava), dtype="float32",
                      speculative_config={"method": "ngram", "num_speculative_tokens": 3})
    plain = LLM(model=str(tiny_llava), dtype="float32")
    assert speculating.generate([request], greedy, use_tqdm=False)[0].outputs[0].token_ids == \
        plain.generate([request], greedy, use_tqdm=False)[0].outputs[0].token_ids
    before = plain.model_runner.encoder_outputs.num_items_encoded
    samples = plain.generate([request], SamplingParams(n=3, max_tokens=6, seed=1, ignore_eos=True),
                             use_tqdm=False)[0]
    assert len(samples.outputs) == 3 and len({tuple(o.token_ids) for o in samples.outputs}) > 1
    assert plain.model_runner.encoder_outputs.num_items_encoded - before <= 1


@pytest.mark.parametrize("prefix", ["model.language_model.", "language_model.model."], ids=["transformers-5", "hub"])
def test_a_lora_adapter_on_the_language_model_gives_transformers_tokens_merged(tiny_llava, tmp_path, prefix):
    """PEFT names a vision-language model's decoder layers under its language model (either layout); the adapter,
    on requests with images, gives transformers' LLaVA tokens with the adapter merged into its weights."""
    import shutil

    from safetensors.torch import load_file, save_file
    from transformers import AutoImageProcessor, LlavaForConditionalGeneration

    from engine.core import LoRARequest
    from engine.models.make_lora import make_lora_adapter
    from tests.engine.lora_fixtures import merged_hf_model

    # The generated tiny Llama is the tiny LLaVA's language model: its adapter, renamed as a LLaVA's.
    text_adapter = make_lora_adapter(tmp_path / "text", default_model_path("tiny", cache_dir=tiny_llava.parents[1]),
                                     rank=4, alpha=8, seed=3)

    def renamed(folder, layers_prefix):
        shutil.copytree(text_adapter, folder)
        tensors = load_file(str(folder / "adapter_model.safetensors"))
        save_file({key.replace("base_model.model.model.", f"base_model.model.{layers_prefix}"): tensor
                   for key, tensor in tensors.items()}, str(folder / "adapter_model.safetensors"))
        return folder

    hf = LlavaForConditionalGeneration.from_pretrained(str(tiny_llava), dtype=torch.float32,
                                                       attn_implementation="eager").eval()
    merged = merged_hf_model(hf, renamed(tmp_path / "merge", "model.language_model."))  # transformers 5's modules
    picture = np.random.RandomState(4).randint(0, 256, (64, 64, 3), dtype=np.uint8)
    llm = LLM(model=str(tiny_llava), dtype="float32", enable_lora=True, max_lora_rank=8, max_num_batched_tokens=12)
    output = llm.generate([{"prompt_token_ids": [1, 7, 511, 9, 10, 11], "multi_modal_data": {"image": picture}}],
                          SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True), use_tqdm=False,
                          lora_request=LoRARequest("vlm", 1, str(renamed(tmp_path / "adapter", prefix))))[0]
    ids = torch.tensor([output.prompt_token_ids])
    pixels = AutoImageProcessor.from_pretrained(str(tiny_llava))(images=[picture], return_tensors="pt")["pixel_values"]
    with torch.no_grad():
        expected, base = (model.generate(input_ids=ids, pixel_values=pixels, max_new_tokens=8, min_new_tokens=8,
                                         do_sample=False, pad_token_id=0)[0, ids.shape[1]:].tolist()
                          for model in (merged, hf))
    assert expected != base  # the adapter changes the tokens
    assert list(output.outputs[0].token_ids) == expected
