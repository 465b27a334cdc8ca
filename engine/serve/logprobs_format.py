"""Engine logprobs (one ``{token_id: Logprob}`` per position, sampled token first) -> OpenAI's shapes.

Completions (legacy): ``{"tokens", "token_logprobs", "top_logprobs": [{token: logprob}], "text_offset"}``
with ``logprobs=k`` top entries per position. Chat: ``{"content": [{"token", "logprob", "bytes",
"top_logprobs": [{"token", "logprob", "bytes"}]}]}`` with ``top_logprobs=k`` entries per position.
The top entries are those of rank 1..k, in rank order; the sampled token may or may not be among them.
vLLM's ``prompt_logprobs`` extension: one entry per prompt token, null for the first, else
``{"<token_id>": {"logprob", "rank", "decoded_token"}}`` holding the prompt token and the top k.

Tokens are shown as their text, which is not unique (byte-level pieces of one character all decode
to U+FFFD), so completions' ``top_logprobs`` dict can hold fewer than k keys. vLLM's
``return_tokens_as_token_ids`` extension names them ``token_id:<id>`` instead, which is unique.
"""

from __future__ import annotations

from typing import Any

from engine.outputs import Logprob, SampleLogprobs


def _token_text(token_id: int, logprob: Logprob, as_token_ids: bool) -> str:
    if as_token_ids or logprob.decoded_token is None:
        return f"token_id:{token_id}"
    return logprob.decoded_token


def _top(position: dict[int, Logprob], num_top: int) -> list[tuple[int, Logprob]]:
    ranked = [(token_id, lp) for token_id, lp in position.items() if lp.rank is not None and lp.rank <= num_top]
    ranked.sort(key=lambda item: item[1].rank)
    return ranked[:num_top]


def _logprob_value(value: float) -> float:
    # JSON has no -inf; OpenAI clients expect a number (vLLM sends -9999.0 too).
    return max(value, -9999.0)


def completion_logprobs(logprobs: SampleLogprobs, token_ids: list[int], num_top: int, text_offset_start: int,
                        as_token_ids: bool = False) -> tuple[dict[str, Any], int]:
    """The completions ``logprobs`` object of these positions, and the text offset after them."""
    tokens, token_logprobs, top_logprobs, text_offset = [], [], [], []
    offset = text_offset_start
    for token_id, position in zip(token_ids, logprobs):
        sampled = position[token_id]
        text = _token_text(token_id, sampled, as_token_ids)
        tokens.append(text)
        token_logprobs.append(_logprob_value(sampled.logprob))
        top: dict[str, float] = {}
        for top_id, top_logprob in _top(position, num_top):
            # On a name collision the better-ranked token keeps the key.
            top.setdefault(_token_text(top_id, top_logprob, as_token_ids), _logprob_value(top_logprob.logprob))
        top.setdefault(text, _logprob_value(sampled.logprob))
        top_logprobs.append(top)
        text_offset.append(offset)
        offset += len(text)
    return {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top_logprobs,
            "text_offset": text_offset}, offset


def prompt_completion_logprobs(prompt_logprobs: list[dict[int, Logprob] | None] | None, token_ids: list[int],
                               num_top: int, decode_token, as_token_ids: bool = False) -> tuple[dict[str, Any], int]:
    """The completions ``logprobs`` of an echoed prompt (``echo``), and the text offset after it. The first
    position, which nothing predicts, has a null logprob and null top entries, as in OpenAI's API;
    ``decode_token(token_id)`` names a token that no logprob entry does."""
    tokens, token_logprobs, top_logprobs, text_offset = [], [], [], []
    offset = 0
    for index, token_id in enumerate(token_ids):
        position = prompt_logprobs[index] if prompt_logprobs is not None and index < len(prompt_logprobs) else None
        if position is None or token_id not in position:
            text = f"token_id:{token_id}" if as_token_ids else decode_token(token_id)
            tokens.append(text)
            token_logprobs.append(None)
            top_logprobs.append(None)
        else:
            entries, _ = completion_logprobs([position], [token_id], num_top, 0, as_token_ids)
            text = entries["tokens"][0]
            tokens.append(text)
            token_logprobs.append(entries["token_logprobs"][0])
            top_logprobs.append(entries["top_logprobs"][0])
        text_offset.append(offset)
        offset += len(text)
    return {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top_logprobs,
            "text_offset": text_offset}, offset


def prompt_logprobs_json(prompt_logprobs: list[dict[int, Logprob] | None] | None, token_ids: list[int],
                         num_top: int) -> list[dict[str, dict[str, Any]] | None] | None:
    """vLLM's ``prompt_logprobs`` of a response: per prompt token, the token's own entry and those of rank 1..k
    (the engine may hold more when echo asked for a larger k), keyed by token id as a string; -inf is sent
    as -9999.0, as vLLM clamps it. None when the engine has none."""
    if prompt_logprobs is None:
        return None
    positions: list[dict[str, dict[str, Any]] | None] = []
    for index, token_id in enumerate(token_ids):
        position = prompt_logprobs[index] if index < len(prompt_logprobs) else None
        if position is None:
            positions.append(None)
            continue
        kept = {token_id: position[token_id]} if token_id in position else {}
        for top_id, top_logprob in _top(position, num_top):
            kept.setdefault(top_id, top_logprob)
        positions.append({str(kept_id): {"logprob": _logprob_value(logprob.logprob), "rank": logprob.rank,
                                         "decoded_token": logprob.decoded_token}
                          for kept_id, logprob in kept.items()})
    return positions


def _chat_entry(token_id: int, logprob: Logprob, as_token_ids: bool) -> dict[str, Any]:
    text = _token_text(token_id, logprob, as_token_ids)
    return {"token": text, "logprob": _logprob_value(logprob.logprob), "bytes": list(text.encode("utf-8"))}


def chat_logprobs(logprobs: SampleLogprobs, token_ids: list[int], num_top: int,
                  as_token_ids: bool = False) -> dict[str, Any]:
    content = []
    for token_id, position in zip(token_ids, logprobs):
        entry = _chat_entry(token_id, position[token_id], as_token_ids)
        entry["top_logprobs"] = [_chat_entry(t, lp, as_token_ids) for t, lp in _top(position, num_top)]
        content.append(entry)
    return {"content": content}
