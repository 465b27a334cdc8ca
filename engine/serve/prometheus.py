"""``GET /metrics``: the engine's statistics in Prometheus' text exposition format (version 0.0.4).

Written by hand (the format is a few lines per metric) rather than with ``prometheus_client``, to keep
the serving extra free of another dependency. Every sample carries a ``model_name`` label.
``servesim_kv_cache_free_blocks`` and ``servesim_kv_cache_usable_blocks`` are there for checks: once
every request has finished or been aborted, the two are equal (no block leaked).
"""

from __future__ import annotations

from engine.engine_stats import EngineStatsSnapshot, Histogram

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
PREFIX = "servesim_"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(labels: dict[str, str]) -> str:
    return "{" + ",".join(f'{key}="{_escape(str(value))}"' for key, value in labels.items()) + "}"


def _number(value: float) -> str:
    if value == float("inf"):
        return "+Inf"
    return repr(float(value)) if isinstance(value, float) else str(value)


class _Writer:
    def __init__(self, model_name: str) -> None:
        self.base = {"model_name": model_name}
        self.lines: list[str] = []

    def header(self, name: str, kind: str, help_text: str) -> None:
        self.lines.append(f"# HELP {PREFIX}{name} {help_text}")
        self.lines.append(f"# TYPE {PREFIX}{name} {kind}")

    def sample(self, name: str, value: float, **labels: str) -> None:
        self.lines.append(f"{PREFIX}{name}{_labels({**self.base, **labels})} {_number(value)}")

    def single(self, name: str, kind: str, help_text: str, value: float) -> None:
        self.header(name, kind, help_text)
        self.sample(name, value)

    def histogram(self, name: str, help_text: str, histogram: Histogram) -> None:
        self.header(name, "histogram", help_text)
        for bound, count in zip(histogram.buckets, histogram.bucket_counts):
            self.sample(f"{name}_bucket", count, le=_number(float(bound)))
        self.sample(f"{name}_bucket", histogram.count, le="+Inf")
        self.sample(f"{name}_sum", float(histogram.total))
        self.sample(f"{name}_count", histogram.count)


def render_metrics(stats: EngineStatsSnapshot, model_name: str) -> str:
    out = _Writer(model_name)
    out.single("num_requests_running", "gauge", "Requests in the running set (holding KV blocks).",
               stats.num_running_reqs)
    out.single("num_requests_waiting", "gauge", "Requests waiting to be scheduled (new or preempted).",
               stats.num_waiting_reqs)
    out.single("kv_cache_usage_perc", "gauge", "Fraction of usable KV blocks held by requests (0 to 1).",
               float(stats.kv_cache_usage))
    out.single("kv_cache_free_blocks", "gauge", "KV blocks free (including cached but unreferenced ones).",
               stats.kv_cache_free_blocks)
    out.single("kv_cache_usable_blocks", "gauge", "KV blocks in the pool, less the reserved null block.",
               stats.kv_cache_usable_blocks)
    out.single("prefix_cache_queries_total", "counter", "Prompt tokens looked up in the prefix cache.",
               stats.prefix_cache_queries)
    out.single("prefix_cache_hits_total", "counter", "Prompt tokens found in the prefix cache.",
               stats.prefix_cache_hits)
    out.single("num_preemptions_total", "counter", "Requests preempted (recomputed later).", stats.num_preemptions)
    out.single("prompt_tokens_total", "counter", "Prompt tokens of finished requests.", stats.prompt_tokens)
    out.single("generation_tokens_total", "counter", "Tokens generated.", stats.generation_tokens)
    out.single("engine_steps_total", "counter", "Engine steps run.", stats.num_steps)
    out.single("spec_decode_num_drafts_total", "counter", "Drafts verified (one request's drafts in one step).",
               stats.spec_decode_num_drafts)
    out.single("spec_decode_num_draft_tokens_total", "counter", "Draft tokens verified.",
               stats.spec_decode_num_draft_tokens)
    out.single("spec_decode_num_accepted_tokens_total", "counter", "Draft tokens accepted.",
               stats.spec_decode_num_accepted_tokens)
    if stats.max_lora:
        out.header("lora_requests_info", "gauge", "LoRA adapters of running and waiting requests (vLLM's "
                   "lora_requests_info; the value is when they were read, in seconds since the epoch).")
        out.sample("lora_requests_info", float(stats.lora_info_time), max_lora=str(stats.max_lora),
                   running_lora_adapters=",".join(stats.running_lora_adapters),
                   waiting_lora_adapters=",".join(stats.waiting_lora_adapters))
    out.header("requests_finished_total", "counter", "Finished requests by finish reason.")
    for reason, count in sorted(stats.finished_requests.items()):
        out.sample("requests_finished_total", count, finished_reason=reason)
    out.histogram("time_to_first_token_seconds", "Time from arrival to the first generated token.",
                  stats.time_to_first_token)
    out.histogram("inter_token_latency_seconds", "Time between consecutive outputs of a request.",
                  stats.inter_token_latency)
    out.histogram("e2e_request_latency_seconds", "Time from arrival to the finish of a request.",
                  stats.e2e_request_latency)
    return "\n".join(out.lines) + "\n"
