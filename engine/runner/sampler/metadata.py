"""SamplingMetadata: a batch's sampling parameters as tensors, built once per step.

Row ``i`` of every tensor belongs to the request in row ``i`` of the logits. Optional tensors are None
when no request in the batch uses the feature, so the sampler skips that stage entirely (the common
all-defaults batch pays for nothing but argmax or one softmax).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch

from engine.core.sampling_params import SamplingParams, SamplingType


def make_generator(seed: int, device: torch.device | str = "cpu") -> torch.Generator:
    """The per-request generator of a seeded request. Create it once, when the request joins the batch,
    and keep it for the request's lifetime: its state carries the request's random stream from step to
    step, independent of whichever other requests share a batch."""
    return torch.Generator(device=device).manual_seed(seed)


@dataclass
class SamplingMetadata:
    vocab_size: int
    temperature: torch.Tensor  # [N] float32; greedy rows hold 1.0 so dividing by it is harmless
    is_greedy: torch.Tensor  # [N] bool
    all_greedy: bool
    all_random: bool
    top_p: torch.Tensor | None  # [N] float32, 1.0 = off
    top_k: torch.Tensor | None  # [N] int64, 0 = off
    min_p: torch.Tensor | None  # [N] float32, 0.0 = off
    generators: dict[int, torch.Generator]  # row -> generator, for seeded random rows
    num_logprobs: list[int | None]  # per row: None = no logprobs, k >= 0 = sampled token plus top k
    max_num_logprobs: int | None  # max over rows asking for logprobs; None if none does
    output_token_ids: list[list[int]]  # tokens generated so far per row (not copied: read-only here)
    no_penalties: bool
    presence_penalties: torch.Tensor  # [N] float32
    frequency_penalties: torch.Tensor  # [N] float32
    repetition_penalties: torch.Tensor  # [N] float32
    prompt_token_ids: torch.Tensor | None  # [N, max_prompt_len] int64 padded with vocab_size; None if unused
    allowed_token_ids_mask: torch.Tensor | None  # [N, vocab] bool, True = NOT allowed; None if unused
    bad_words_token_ids: dict[int, list[list[int]]]  # row -> tokenized bad words
    min_tokens: dict[int, tuple[int, list[int]]]  # row -> (min_tokens, token ids to suppress until then)
    logit_bias: list[dict[int, float] | None]
    _output_token_tensor: torch.Tensor | None = field(default=None, repr=False)

    @property
    def num_reqs(self) -> int:
        return self.temperature.shape[0]

    @property
    def device(self) -> torch.device:
        return self.temperature.device

    def output_token_tensor(self) -> torch.Tensor:
        """[N, max_output_len] int64 of output tokens, padded with vocab_size (an out-of-vocab id whose
        counts land in a column the penalty code slices away)."""
        if self._output_token_tensor is None:
            self._output_token_tensor = _pad(self.output_token_ids, self.vocab_size, self.device)
        return self._output_token_tensor

    @classmethod
    def from_requests(
        cls,
        sampling_params: Sequence[SamplingParams],
        output_token_ids: Sequence[list[int]],
        prompt_token_ids: Sequence[Sequence[int]] | None = None,
        generators: Mapping[int, torch.Generator] | None = None,
        bad_words_token_ids: Sequence[list[list[int]] | None] | None = None,
        eos_token_id: int | Sequence[int] | None = None,
        *,
        vocab_size: int,
        device: torch.device | str = "cpu",
    ) -> "SamplingMetadata":
        """Metadata for a batch whose row ``i`` is the request with ``sampling_params[i]``.

        ``prompt_token_ids`` is needed only if some row has a repetition penalty; ``generators`` must hold
        a generator (see ``make_generator``) for every seeded, non-greedy row; ``bad_words_token_ids[i]``
        is row i's ``SamplingParams.bad_words`` already tokenized; ``eos_token_id`` is suppressed with the
        stop tokens while a row is below ``min_tokens`` (unless the row sets ``ignore_eos``).
        """
        num_reqs = len(sampling_params)
        if len(output_token_ids) != num_reqs:
            raise ValueError(f"output_token_ids has {len(output_token_ids)} rows for {num_reqs} requests")
        generators = dict(generators or {})
        device = torch.device(device)

        greedy = [p.sampling_type == SamplingType.GREEDY for p in sampling_params]
        for row, params in enumerate(sampling_params):
            if params.sampling_type == SamplingType.RANDOM_SEED and row not in generators:
                raise ValueError(f"row {row} has SamplingParams.seed={params.seed} but no generator; create one "
                                 "with make_generator(seed) when the request joins and pass it every step")

        def floats(values: list[float]) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.float32, device=device)

        top_p = [p.top_p for p in sampling_params]
        # A top_k of the vocabulary or more keeps every token, so it is off (0), as vLLM's input batch sets it;
        # left as given, one beyond int64 (top_k has no upper bound) overflowed the tensor below and failed
        # every request in the step.
        top_k = [p.top_k if 0 < p.top_k < vocab_size else 0 for p in sampling_params]
        min_p = [p.min_p for p in sampling_params]
        presence = [p.presence_penalty for p in sampling_params]
        frequency = [p.frequency_penalty for p in sampling_params]
        repetition = [p.repetition_penalty for p in sampling_params]
        no_penalties = all(x == 0.0 for x in presence + frequency) and all(x == 1.0 for x in repetition)

        prompt_tensor = None
        if any(x != 1.0 for x in repetition):
            if prompt_token_ids is None or len(prompt_token_ids) != num_reqs:
                raise ValueError("prompt_token_ids (one list per row) is required when a row has a "
                                 "repetition_penalty")
            prompt_tensor = _pad([list(p) for p in prompt_token_ids], vocab_size, device)

        num_logprobs = [p.logprobs for p in sampling_params]
        requested = [k for k in num_logprobs if k is not None]
        max_num_logprobs = max(requested) if requested else None
        if max_num_logprobs is not None and max_num_logprobs > vocab_size:
            raise ValueError(f"SamplingParams.logprobs must be <= vocab size {vocab_size}, got {max_num_logprobs}")

        return cls(
            vocab_size=vocab_size,
            temperature=floats([1.0 if g else p.temperature for g, p in zip(greedy, sampling_params)]),
            is_greedy=torch.tensor(greedy, dtype=torch.bool, device=device),
            all_greedy=all(greedy),
            all_random=not any(greedy),
            top_p=floats(top_p) if any(x < 1.0 for x in top_p) else None,
            top_k=torch.tensor(top_k, dtype=torch.long, device=device) if any(k > 0 for k in top_k)
            else None,
            min_p=floats(min_p) if any(x > 0.0 for x in min_p) else None,
            generators={row: g for row, g in generators.items() if not greedy[row]},
            num_logprobs=num_logprobs,
            max_num_logprobs=max_num_logprobs,
            output_token_ids=list(output_token_ids),
            no_penalties=no_penalties,
            presence_penalties=floats(presence),
            frequency_penalties=floats(frequency),
            repetition_penalties=floats(repetition),
            prompt_token_ids=prompt_tensor,
            allowed_token_ids_mask=_allowed_mask(sampling_params, vocab_size, device),
            bad_words_token_ids=_bad_words(bad_words_token_ids, num_reqs, vocab_size),
            min_tokens=_min_tokens(sampling_params, eos_token_id, vocab_size),
            logit_bias=[_checked_bias(p.logit_bias, vocab_size) for p in sampling_params],
        )


def _pad(rows: Sequence[Sequence[int]], pad_id: int, device: torch.device) -> torch.Tensor:
    width = max((len(r) for r in rows), default=0)
    out = torch.full((len(rows), width), pad_id, dtype=torch.long)
    for i, r in enumerate(rows):
        if r:
            out[i, :len(r)] = torch.tensor(r, dtype=torch.long)
    return out.to(device)


def _check_ids(name: str, ids: Sequence[int], vocab_size: int) -> None:
    bad = [t for t in ids if not 0 <= t < vocab_size]
    if bad:
        raise ValueError(f"{name} has token id(s) {bad[:5]} outside the vocabulary [0, {vocab_size})")


def _allowed_mask(params: Sequence[SamplingParams], vocab_size: int, device: torch.device) -> torch.Tensor | None:
    if all(p.allowed_token_ids is None for p in params):
        return None
    mask = torch.zeros(len(params), vocab_size, dtype=torch.bool)
    for row, p in enumerate(params):
        if p.allowed_token_ids is not None:
            _check_ids("SamplingParams.allowed_token_ids", p.allowed_token_ids, vocab_size)
            mask[row] = True
            mask[row, p.allowed_token_ids] = False
    return mask.to(device)


def _bad_words(bad_words: Sequence[list[list[int]] | None] | None, num_reqs: int,
               vocab_size: int) -> dict[int, list[list[int]]]:
    if bad_words is None:
        return {}
    if len(bad_words) != num_reqs:
        raise ValueError(f"bad_words_token_ids has {len(bad_words)} rows for {num_reqs} requests")
    out = {}
    for row, words in enumerate(bad_words):
        if words:
            for word in words:
                if not word:
                    raise ValueError(f"bad_words_token_ids row {row} has an empty word")
                _check_ids("bad_words_token_ids", word, vocab_size)
            out[row] = [list(w) for w in words]
    return out


def _min_tokens(params: Sequence[SamplingParams], eos_token_id: int | Sequence[int] | None,
                vocab_size: int) -> dict[int, tuple[int, list[int]]]:
    # Some configs (Llama 3) list several EOS ids; all of them end a sequence.
    eos_ids = set() if eos_token_id is None else {eos_token_id} if isinstance(eos_token_id, int) else set(eos_token_id)
    out = {}
    for row, p in enumerate(params):
        if p.min_tokens <= 0:
            continue
        stop_ids = set(p.stop_token_ids or [])
        if not p.ignore_eos:
            stop_ids |= eos_ids
        stop_ids = sorted(t for t in stop_ids if t < vocab_size)  # ids past the logits cannot be sampled
        if stop_ids:
            out[row] = (p.min_tokens, stop_ids)
    return out


def _checked_bias(bias: dict[int, float] | None, vocab_size: int) -> dict[int, float] | None:
    if bias:
        _check_ids("SamplingParams.logit_bias", list(bias), vocab_size)
        return bias
    return None
