"""Load: 200 concurrent streaming requests, one in five closing its stream after two chunks.

Every request that stays gets exactly its tokens; the ones that leave are aborted in the engine;
afterwards every request has ended, no request runs or waits and every KV block is free. Bounded: 200
requests, a 60 s ceiling on the whole exchange.

A leaver asks for far more tokens than it reads, so it is normally aborted long before it could
finish. Not always: the server is another process on the same two cores, and a client starved of the
CPU for a second or two (CI runs tests in parallel) once read its two chunks after 7 of the 40 leavers
had generated all their tokens and ended with ``length``. So the count of aborts is bounded from below
(most leavers), and every leaver is accounted for as an abort or a finish.
"""

import asyncio
import time

import httpx
import openai

from tests.serve.serve_helpers import metric, parse_metrics, wait_until_idle

NUM_REQUESTS = 200
DISCONNECT_EVERY = 5          # request i disconnects when i % 5 == 0: 40 of 200
CHUNKS_BEFORE_DISCONNECT = 2
LEAVER_MAX_TOKENS = 480       # normally never reached: the client leaves after two chunks (max model len 512)
LOAD_TIMEOUT_S = 60.0


async def _one(client: openai.AsyncOpenAI, index: int) -> dict:
    leaves = index % DISCONNECT_EVERY == 0
    max_tokens = LEAVER_MAX_TOKENS if leaves else 8 + index % 9
    stream = await client.completions.create(
        model="tiny", prompt=f"request number {index} says", max_tokens=max_tokens,
        temperature=0.0 if index % 2 else 1.0, seed=index, stream=True, stream_options={"include_usage": True},
        extra_body={"ignore_eos": True})
    chunks, text, usage, finish_reason = 0, [], None, None
    async for chunk in stream:
        if chunk.choices:
            chunks += 1
            text.append(chunk.choices[0].text)
            finish_reason = chunk.choices[0].finish_reason or finish_reason
        if chunk.usage is not None:
            usage = chunk.usage
        if leaves and chunks == CHUNKS_BEFORE_DISCONNECT:
            await stream.close()
            return {"left": True}
    return {"left": False, "max_tokens": max_tokens, "usage": usage, "finish_reason": finish_reason,
            "text": "".join(text)}


async def _load(url: str) -> list:
    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=LOAD_TIMEOUT_S,
                                http_client=httpx.AsyncClient(limits=httpx.Limits(max_connections=NUM_REQUESTS + 10)))
    async with client:
        return await asyncio.wait_for(
            asyncio.gather(*(_one(client, index) for index in range(NUM_REQUESTS)), return_exceptions=True),
            LOAD_TIMEOUT_S)


def test_concurrent_streams_with_disconnects_leave_every_block_free(server):
    before = wait_until_idle(server.url)
    started = time.perf_counter()
    results = asyncio.run(_load(server.url))
    duration = time.perf_counter() - started
    errors = [result for result in results if isinstance(result, BaseException)]
    assert not errors, errors[:3]
    stayed = [result for result in results if not result["left"]]
    left = [result for result in results if result["left"]]
    assert len(left) == NUM_REQUESTS // DISCONNECT_EVERY and len(stayed) == NUM_REQUESTS - len(left)
    for result in stayed:
        assert result["finish_reason"] == "length"
        assert result["usage"].completion_tokens == result["max_tokens"]
        assert result["usage"].total_tokens == result["usage"].prompt_tokens + result["max_tokens"]

    after = wait_until_idle(server.url)
    assert metric(after, "servesim_kv_cache_free_blocks") == metric(after, "servesim_kv_cache_usable_blocks")
    assert metric(after, "servesim_kv_cache_usage_perc") == 0.0

    def finished(samples, reason):
        return metric(samples, "servesim_requests_finished_total", finished_reason=reason)

    aborted = finished(after, "abort") - finished(before, "abort")
    ran_out = finished(after, "length") - finished(before, "length") - len(stayed)
    assert aborted + ran_out == len(left) and aborted >= len(left) // 2, (aborted, ran_out)
    # The leavers stopped early: fewer tokens than the 480 each one asked for. Not half: on two busy cores
    # (the suite under xdist) the server noticed the disconnects late enough for the leavers to average 258
    # tokens once (12,233 generated against a bound of 11,517); three quarters still fails a server that
    # ignores most disconnects.
    generated = metric(after, "servesim_generation_tokens_total") - metric(before, "servesim_generation_tokens_total")
    assert generated < sum(r["max_tokens"] for r in stayed) + len(left) * LEAVER_MAX_TOKENS * 3 // 4
    print(f"\nload: {NUM_REQUESTS} streams, {len(left)} disconnects, {duration:.2f} s, "
          f"{int(generated)} tokens generated")


def test_metrics_text_is_prometheus_shaped(server):
    text = httpx.get(f"{server.url}/metrics").text
    samples = parse_metrics(text)
    assert "# TYPE servesim_time_to_first_token_seconds histogram" in text
    assert "# TYPE servesim_prefix_cache_hits_total counter" in text
    for name in ("time_to_first_token_seconds", "inter_token_latency_seconds", "e2e_request_latency_seconds"):
        count = metric(samples, f"servesim_{name}_count")
        assert metric(samples, f"servesim_{name}_bucket", le="+Inf") == count
    for name in ("servesim_num_requests_running", "servesim_num_requests_waiting", "servesim_kv_cache_usage_perc",
                 "servesim_prefix_cache_queries_total", "servesim_prefix_cache_hits_total"):
        assert metric(samples, name, model_name="tiny") >= 0


def test_metrics_are_also_under_vllms_names(server):
    """Dashboards written for vLLM read this server: every metric vLLM exports is repeated under its name, with the
    same value and vLLM's engine label."""
    samples = parse_metrics(httpx.get(f"{server.url}/metrics").text)
    pairs = {"num_requests_running": "num_requests_running", "kv_cache_usage_perc": "kv_cache_usage_perc",
             "generation_tokens_total": "generation_tokens_total", "prompt_tokens_total": "prompt_tokens_total",
             "time_to_first_token_seconds_count": "time_to_first_token_seconds_count"}
    for own, vllm in pairs.items():
        assert metric(samples, f"vllm:{vllm}", model_name="tiny", engine="0") == metric(samples, f"servesim_{own}")
    assert metric(samples, "vllm:e2e_request_latency_seconds_bucket", le="+Inf") == \
        metric(samples, "servesim_e2e_request_latency_seconds_bucket", le="+Inf")
    assert metric(samples, "vllm:request_success_total", finished_reason="length") == \
        metric(samples, "servesim_requests_finished_total", finished_reason="length")
    assert not any(name.startswith(("vllm:engine_steps", "vllm:kv_cache_free")) for name in samples)
