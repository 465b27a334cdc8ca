"""``GET /metrics``: the engine's statistics in Prometheus' text exposition format (version 0.0.4).

Written by hand (the format is a few lines per metric) rather than with ``prometheus_client``, to keep
the serving extra free of another dependency. Every sample carries a ``model_name`` label.
``servesim_kv_cache_free_blocks`` and ``servesim_kv_cache_usable_blocks`` are there for checks: once
every request has finished or been aborted, the two are equal (no block leaked).

Every metric vLLM also exports is written a second time under vLLM's name (``vllm:num_requests_running``,
``vllm:kv_cache_usage_perc``, ``vllm:request_success_total``, ``vllm:time_to_first_token_seconds``...), with vLLM's
``engine`` label, so that dashboards and alerts written for a vLLM server read this one unchanged.
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


# This server's metric -> vLLM's name for the same one (metrics vLLM does not export are not repeated).
VLLM_NAMES = {
    "num_requests_running": "num_requests_running", "num_requests_waiting": "num_requests_waiting",
    "kv_cache_usage_perc": "kv_cache_usage_perc", "prefix_cache_queries_total": "prefix_cache_queries_total",
    "prefix_cache_hits_total": "prefix_cache_hits_total", "num_preemptions_total": "num_preemptions_total",
    "prompt_tokens_total": "prompt_tokens_total", "generation_tokens_total": "generation_tokens_total",
    "spec_decode_num_drafts_total": "spec_decode_num_drafts_total",
    "spec_decode_num_draft_tokens_total": "spec_decode_num_draft_tokens_total",
    "spec_decode_num_accepted_tokens_total": "spec_decode_num_accepted_tokens_total",
    "lora_requests_info": "lora_requests_info", "requests_finished_total": "request_success_total",
    "time_to_first_token_seconds": "time_to_first_token_seconds",
    "inter_token_latency_seconds": "inter_token_latency_seconds",
    "e2e_request_latency_seconds": "e2e_request_latency_seconds",
}
VLLM_PREFIX = "vllm:"


class _Writer:
    """One family of names: this server's (``servesim_``), or vLLM's (``vllm:``, only the metrics in ``names``)."""

    def __init__(self, model_name: str, prefix: str = PREFIX, names: dict[str, str] | None = None,
                 labels: dict[str, str] | None = None) -> None:
        self.base = {"model_name": model_name, **(labels or {})}
        self.prefix = prefix
        self.names = names
        self.lines: list[str] = []

    def _full(self, name: str) -> str | None:
        if self.names is None:
            return self.prefix + name
        return self.prefix + self.names[name] if name in self.names else None

    def header(self, name: str, kind: str, help_text: str) -> None:
        full = self._full(name)
        if full is not None:
            self.lines.append(f"# HELP {full} {help_text}")
            self.lines.append(f"# TYPE {full} {kind}")

    def sample(self, name: str, value: float, suffix: str = "", **labels: str) -> None:
        full = self._full(name)
        if full is not None:
            self.lines.append(f"{full}{suffix}{_labels({**self.base, **labels})} {_number(value)}")

    def single(self, name: str, kind: str, help_text: str, value: float) -> None:
        self.header(name, kind, help_text)
        self.sample(name, value)

    def histogram(self, name: str, help_text: str, histogram: Histogram) -> None:
        self.header(name, "histogram", help_text)
        for bound, count in zip(histogram.buckets, histogram.bucket_counts):
            self.sample(name, count, "_bucket", le=_number(float(bound)))
        self.sample(name, histogram.count, "_bucket", le="+Inf")
        self.sample(name, float(histogram.total), "_sum")
        self.sample(name, histogram.count, "_count")


def render_metrics(stats: EngineStatsSnapshot, model_name: str) -> str:
    """Both families: this server's names, then vLLM's."""
    own = _write(_Writer(model_name), stats)
    vllm = _write(_Writer(model_name, VLLM_PREFIX, VLLM_NAMES, {"engine": "0"}), stats)
    return "\n".join(own.lines + vllm.lines) + "\n"


def _write(out: _Writer, stats: EngineStatsSnapshot) -> _Writer:
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
    return out
