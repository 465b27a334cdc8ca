"""A workload against a running OpenAI-compatible server, measured from the client side.

The same request stream as a simulated or in-process real run (``workloads.generate_requests`` with
the server model's vocabulary) is sent over HTTP at its arrival times: one streaming
``/v1/completions`` request per workload request, the prompt as token ids, ``max_tokens`` = its
output length and ``ignore_eos`` (so every request produces exactly its output length, as in the
other modes). Each token's time is the arrival of the SSE chunk that carried it (``return_token_ids``
says how many a chunk carries; a server without that extension is assumed to send one per chunk),
and the token count is the final ``usage`` when the server sends one.

A workload of multi-turn sessions sends each later turn ``think_time_s`` after the turn before it finished,
its prompt that turn's prompt and the token ids the server returned for it (``return_token_ids``), then the
user's new tokens; a server that returns no ids cannot continue a conversation, and the session's remaining
turns are recorded as errors saying so. With ``workload.max_concurrency`` each request waits for a free slot.
A request of a LoRA workload names its adapter as its model (vLLM's way), so the server must serve the
workload's adapters under their names (``python -m sim.real_lora_adapters WORKLOAD`` prints the flags).

The run directory has the usual files. ``steps.parquet`` is empty: a client cannot see engine steps,
so step metrics (KV usage, step counts) are absent from the summary; preemptions are unknown (0). The
prefix-cache hit rate is the server's own count of cached prompt tokens per request
(``usage.prompt_tokens_details.cached_tokens``) over their prompt tokens, null where the server gives
no count (vLLM without ``--enable-prompt-tokens-details``). Client-side latencies include HTTP and SSE
overhead, which is the point: compare them with an in-process real run of the same workload to see what
serving costs.

    summary = run_against_server(load_workload("cpu_chat.yaml"), "http://127.0.0.1:8000", "runs/served")
"""

from __future__ import annotations

import asyncio
import json
import math
import platform
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from array import array

import httpx
from tqdm import tqdm

from analysis import compute_summary, write_run
from sim.real_images import check_real_run_images
from engine.core.scheduling_policy import reads_priority
from analysis.trace_schema import FINISH_REASONS, REQUIRED_STEP_COLUMNS, requests_table, steps_table
from workloads import RequestSpec, WorkloadConfig, generate_requests
from workloads.request_spec import DEFAULT_REQUEST_CLASS, count_requests

# Long enough for any request of a sane workload; a stuck server still ends the run eventually.
REQUEST_TIMEOUT_S = 600.0
MAX_ERRORS_KEPT = 5


@dataclass(frozen=True)
class _RequestShape:
    """What every request of one run carries beside its own tokens: the served model's name (an adapter's
    request names the adapter instead), whether to send its priority, and the sampling temperature."""
    model: str
    send_priority: bool = False
    temperature: float | None = None


@dataclass
class _Record:
    request_id: str
    arrival_time: float
    num_prompt_tokens: int
    request_class: str = DEFAULT_REQUEST_CLASS  # the workload class it was drawn from (RequestSpec.request_class)
    first_token_time: float = math.nan
    finish_time: float = math.nan
    num_output_tokens: int = 0
    num_cached_tokens: int = 0
    finish_reason: str | None = None
    token_times: list[float] = field(default_factory=list)
    error: str | None = None
    cached_tokens_reported: bool = False  # whether the server's usage said how many prompt tokens were cached
    session_id: str | None = None  # a multi-turn session's first request's id (RequestSpec.session_id), and the turn
    turn: int = 1
    lora_name: str | None = None  # the adapter it asked for (its model), None for the base model
    client_wait_s: float | None = None  # seconds it waited for a free slot (workload.max_concurrency), None without
    # The generated token ids the server returned (return_token_ids); None when a chunk came without them.
    output_token_ids: list[int] | None = field(default_factory=list)


def auth_headers(api_key: str | None) -> dict[str, str]:
    """The header that carries ``api_key`` (none without one), as the openai client sends it."""
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def server_vocabulary(url: str, model_name: str | None = None, tokenizer_path: str | Path | None = None,
                      api_key: str | None = None) -> tuple[str, int, list[int], dict[str, Any]]:
    """(model name, vocab size, reserved token ids, model card) of the server's model.

    The vocabulary comes from ``tokenizer_path`` when given, else from the model card's
    ``vocab_size`` / ``reserved_token_ids`` (fields this project's server adds to ``/v1/models``).
    """
    try:
        response = httpx.get(f"{url}/v1/models", timeout=30.0, headers=auth_headers(api_key))
    except httpx.HTTPError as error:  # nothing listening, a wrong host, a timeout: the user's --url
        raise ValueError(f"cannot reach the server at {url}: {error or type(error).__name__}") from None
    if response.status_code == 401:
        raise ValueError(f"{url} asks for an API key ({server_error_message(response.text)}): pass --api-key, or set "
                         "OPENAI_API_KEY" if api_key is None else f"{url} refused the API key given: "
                         f"{server_error_message(response.text)}")
    if response.status_code != 200:
        raise ValueError(f"{url}/v1/models answered HTTP {response.status_code}: "
                         f"{server_error_message(response.text)} (is {url} an OpenAI-compatible server?)")
    try:
        cards = response.json().get("data") or []
    except (ValueError, AttributeError):
        raise ValueError(f"{url}/v1/models did not answer with a model list (is {url} an OpenAI-compatible "
                         "server?)") from None
    if not cards:
        raise ValueError(f"{url}/v1/models lists no model")
    card = next((c for c in cards if c.get("id") == model_name), None) if model_name else cards[0]
    if card is None:
        raise ValueError(f"model_name {model_name!r} is not served by {url} (it serves "
                         f"{[c.get('id') for c in cards]})")
    if tokenizer_path is not None:
        from engine.models import load_tokenizer

        tokenizer = load_tokenizer(Path(tokenizer_path))
        return card["id"], len(tokenizer), sorted(int(t) for t in tokenizer.all_special_ids), card
    if "vocab_size" not in card:
        raise ValueError(f"{url}/v1/models does not say the vocabulary size; pass tokenizer_path")
    return card["id"], int(card["vocab_size"]), sorted(int(t) for t in card.get("reserved_token_ids", [])), card


def run_against_server(workload: WorkloadConfig, url: str, out_dir: str | Path | None, *,
                       model_name: str | None = None, tokenizer_path: str | Path | None = None,
                       progress: bool = False, api_key: str | None = None) -> dict[str, Any]:
    """Send the workload to the server at ``url``; write the run directory (if ``out_dir``); return the
    summary (mode "real", ``config.executor = {"kind": "server", "url": ...}``). ``api_key``: sent as a bearer
    token with every request (vLLM's and this project's ``--api-key``)."""
    check_real_run_images(workload, None, executor="server")
    url = url.rstrip("/")
    model, vocab_size, reserved, card = server_vocabulary(url, model_name, tokenizer_path, api_key)
    specs = generate_requests(workload, vocab_size=vocab_size, reserved_token_ids=reserved,
                              model_max_len=card.get("max_model_len"))
    started = time.perf_counter()
    # A workload whose policy reads priorities sends each request's (the server must schedule by such a policy:
    # a server that schedules fcfs refuses them, which the run reports); otherwise none is sent.
    send_priority = reads_priority(workload.engine.scheduling_policy)
    records = asyncio.run(_send_all(specs, url, model, progress, workload.name, send_priority,
                                    workload.workload.max_concurrency, api_key, workload.workload.temperature))
    wall_s = time.perf_counter() - started
    requests = requests_table(_columns(records))
    steps = steps_table({name: [] for name in REQUIRED_STEP_COLUMNS})
    config = {
        "workload": workload.to_dict(),
        "vocab_size": vocab_size,
        "reserved_token_ids": reserved,
        "executor": {"kind": "server", "url": url, "model": model, "max_model_len": card.get("max_model_len")},
        "python": platform.python_version(),
    }
    slo = workload.slo.model_dump(exclude_none=True) if workload.slo is not None else None
    summary = compute_summary(requests.to_pandas(), steps.to_pandas(), name=workload.name, mode="real",
                              config=config, slo=slo, class_slos=workload.class_slos())
    errors = [f"{r.request_id}: {r.error}" for r in records if r.error]
    summary["num_request_errors"] = len(errors)
    summary["request_errors"] = errors[:MAX_ERRORS_KEPT]
    summary["client_wall_s"] = wall_s
    # compute_summary reads the hit rate from engine steps, which a client has none of (it would say 0).
    summary["prefix_cache_hit_rate"] = served_prefix_hit_rate(records)
    if out_dir is not None:
        write_run(Path(out_dir), requests, steps, summary)
    return summary


async def _send_all(specs: list[RequestSpec], url: str, model: str, progress: bool, name: str,
                    send_priority: bool = False, max_concurrency: int | None = None,
                    api_key: str | None = None, temperature: float | None = None) -> list[_Record]:
    """``temperature``: workload.temperature, sent with every request (None: the server's default)."""
    shape = _RequestShape(model, send_priority, temperature)
    # No pool limit: a request queued inside the client would be charged the wait as server latency.
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
    bar = tqdm(total=count_requests(specs), desc=f"{name} (server)", unit="req", disable=not progress,
               mininterval=0.5, leave=False)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=REQUEST_TIMEOUT_S,
                                 headers=auth_headers(api_key)) as client:
        origin = time.perf_counter()
        # The client's limit (workload.max_concurrency): a request waits for a slot, and its latencies count from
        # when it is sent, as in vLLM's bench serve --max-concurrency (asyncio's semaphore wakes waiters in order).
        slots = asyncio.Semaphore(max_concurrency) if max_concurrency else None
        tasks = []
        for spec in sorted(specs, key=lambda s: s.arrival_time):
            delay = origin + spec.arrival_time - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(_send_session(client, shape, spec, origin, bar, slots)))
        sessions = await asyncio.gather(*tasks)
    bar.close()
    return [record for session in sessions for record in session]


async def _send_session(client: httpx.AsyncClient, shape: _RequestShape, spec: RequestSpec, origin: float, bar,
                        slots: asyncio.Semaphore | None) -> list[_Record]:
    """``spec``'s request, then its session's later turns, each when its think time after the one before is up."""
    records = [await _send(client, shape, spec, origin, bar, slots)]
    while spec.next_turns:
        record = records[-1]
        if record.error is None and record.output_token_ids is None:
            record.error = "the server returned no token ids (return_token_ids): a session cannot resend its history"
        if record.error is not None:
            # The conversation cannot go on: its remaining turns are errors, so that every request is accounted for.
            records += [_Record(turn.request_id, record.finish_time, 0, spec.request_class, finish_time=record.finish_time,
                                finish_reason="error", error=f"an earlier turn of its session failed ({record.request_id})",
                                session_id=spec.session_id, turn=spec.turn + offset)
                        for offset, turn in enumerate(spec.next_turns, start=1)]
            bar.update(len(spec.next_turns))
            break
        conversation = array("q", spec.prompt_token_ids)
        conversation.extend(record.output_token_ids)
        spec = spec.next_turn(conversation, record.finish_time)
        delay = origin + spec.arrival_time - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        records.append(await _send(client, shape, spec, origin, bar, slots))
    return records


async def _send(client: httpx.AsyncClient, shape: _RequestShape, spec: RequestSpec, origin: float, bar,
                slots: asyncio.Semaphore | None = None) -> _Record:
    if slots is not None:
        waiting_since = time.perf_counter() - origin
        async with slots:
            record = await _send(client, shape, spec, origin, bar)
        record.client_wait_s = record.arrival_time - waiting_since
        return record

    def now() -> float:
        return time.perf_counter() - origin

    record = _Record(spec.request_id, now(), len(spec.prompt_token_ids), spec.request_class,
                     session_id=spec.session_id, turn=spec.turn, lora_name=spec.lora_name)
    body = {"model": spec.lora_name or shape.model, "prompt": list(spec.prompt_token_ids),
            "max_tokens": spec.output_len, "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True},
            "return_token_ids": True}
    if shape.send_priority:
        body["priority"] = spec.priority
    if shape.temperature is not None:
        body["temperature"] = shape.temperature
    num_counted = 0
    usage = None
    try:
        async with client.stream("POST", "/v1/completions", json=body) as response:
            if response.status_code != 200:
                text = (await response.aread()).decode("utf-8", "replace")
                raise RuntimeError(f"HTTP {response.status_code}: {server_error_message(text)}")
            async for line in response.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    raise RuntimeError(f"error event: {chunk['error'].get('message')}")
                arrived = now()
                for choice in chunk.get("choices") or []:
                    token_ids = choice.get("token_ids")
                    count = len(token_ids) if token_ids is not None else (1 if choice.get("text") else 0)
                    if token_ids is None and count:
                        record.output_token_ids = None
                    elif record.output_token_ids is not None and token_ids:
                        record.output_token_ids.extend(int(token) for token in token_ids)
                    if count and math.isnan(record.first_token_time):
                        record.first_token_time = arrived
                    record.token_times.extend([arrived] * count)
                    num_counted += count
                    if choice.get("finish_reason"):
                        record.finish_reason = choice["finish_reason"]
                        record.finish_time = arrived
                usage = chunk.get("usage") or usage
    except (httpx.HTTPError, RuntimeError, ValueError) as error:
        record.error = str(error) or type(error).__name__
        record.finish_reason = "error"
    if math.isnan(record.finish_time):
        record.finish_time = now()
    if record.finish_reason not in FINISH_REASONS:
        record.finish_reason = "error"
    record.num_output_tokens = num_counted
    if usage:
        record.num_output_tokens = int(usage.get("completion_tokens", num_counted))
        record.num_prompt_tokens = int(usage.get("prompt_tokens", record.num_prompt_tokens))
        cached_tokens = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
        record.cached_tokens_reported = cached_tokens is not None
        record.num_cached_tokens = int(cached_tokens or 0)
    bar.update(1)
    return record


def served_prefix_hit_rate(records: list[_Record]) -> float | None:
    """Cached prompt tokens / prompt tokens over the requests whose usage counted their cached tokens: the
    engine's rate (vLLM's prefix-cache hit rate is in tokens too, counted when a request is first
    scheduled, which is what ``cached_tokens`` reports). None when no request's usage counted them."""
    reported = [record for record in records if record.cached_tokens_reported]
    num_prompt_tokens = sum(record.num_prompt_tokens for record in reported)
    return sum(record.num_cached_tokens for record in reported) / num_prompt_tokens if num_prompt_tokens else None


def server_error_message(text: str) -> str:
    """The message of an OpenAI-shaped error body (``{"error": {"message": ...}}``), else the text itself
    (shortened: an HTML error page says little past its start)."""
    try:
        error = json.loads(text).get("error")
        message = error.get("message") if isinstance(error, dict) else error
    except (ValueError, AttributeError):
        message = None
    return str(message) if message else text[:300]


def _columns(records: list[_Record]) -> dict[str, list]:
    columns = {
        "request_id": [r.request_id for r in records],
        "arrival_time": [r.arrival_time for r in records],
        "first_token_time": [r.first_token_time for r in records],
        "finish_time": [r.finish_time for r in records],
        "num_prompt_tokens": [r.num_prompt_tokens for r in records],
        "num_output_tokens": [r.num_output_tokens for r in records],
        "num_cached_tokens": [r.num_cached_tokens for r in records],
        "num_preemptions": [0 for _ in records],
        "finish_reason": [r.finish_reason for r in records],
        # Why a request failed, as the server said it (a 400's message): the summary names the first few.
        "status_message": [r.error for r in records],
        "request_class": [r.request_class for r in records],
        "token_times": [r.token_times for r in records],
    }
    if any(r.client_wait_s is not None for r in records):
        columns["client_wait_s"] = [r.client_wait_s or 0.0 for r in records]
    if any(r.lora_name is not None for r in records):
        columns["lora_name"] = [r.lora_name for r in records]
    if any(r.session_id is not None for r in records):
        columns["session_id"] = [r.session_id for r in records]
        columns["turn"] = [r.turn for r in records]
    return columns


__all__ = ["run_against_server", "server_vocabulary"]
