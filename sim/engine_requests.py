"""The engine request for a workload request, as every driver (simulated, wall-clock, disaggregated) makes it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from engine.core import LoRARequest, MultiModalFeature, Request, SamplingParams
from workloads import RequestSpec


def make_request(spec: RequestSpec, params_by_output_len: dict[int, SamplingParams], *, max_tokens: int | None = None,
                 do_remote_prefill: bool = False, do_remote_decode: bool = False,
                 lora_paths: Mapping[str, str] | None = None, image_pixels: Mapping[str, Any] | None = None,
                 temperature: float | None = None) -> Request:
    """Exactly ``output_len`` tokens (or ``max_tokens``: a disaggregated prefill's one), EOS ignored. The
    sampling parameters are shared by every request of one length (``params_by_output_len`` caches them).
    ``lora_paths``: each adapter's folder, for a real runner (the simulator needs none); ``image_pixels``: each image
    identifier's pixels, for a real runner that encodes them; ``temperature``: workload.temperature (None: the
    engine's default; the simulator never samples, so only real runs feel it)."""
    num_tokens = spec.output_len if max_tokens is None else max_tokens
    params = params_by_output_len.get(num_tokens)
    if params is None:
        sampling = {} if temperature is None else {"temperature": temperature}
        params = params_by_output_len[num_tokens] = SamplingParams(max_tokens=num_tokens, ignore_eos=True, **sampling)
    lora_request = None if spec.lora_name is None else LoRARequest(
        spec.lora_name, spec.lora_int_id, lora_paths.get(spec.lora_name, "") if lora_paths else "")
    mm_features = [MultiModalFeature(*image, data=None if image_pixels is None else image_pixels[image[0]])
                   for image in spec.images] if spec.images else ()
    return Request(spec.request_id, spec.prompt_token_ids, params, arrival_time=spec.arrival_time,
                   priority=spec.priority, do_remote_prefill=do_remote_prefill, do_remote_decode=do_remote_decode,
                   lora_request=lora_request, mm_features=mm_features)
