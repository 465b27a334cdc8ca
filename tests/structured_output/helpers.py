"""What the structured-output tests share: the schema they ask for and a check of it written out by hand."""

SCHEMA = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}, "color": {"enum": ["red", "green", "blue"]}},
    "required": ["ok", "color"],
    "additionalProperties": False,
}


def satisfies_schema(value) -> bool:
    """SCHEMA checked by hand (jsonschema is not a dependency): exactly the two required keys, typed."""
    return (isinstance(value, dict) and set(value) == {"ok", "color"} and isinstance(value["ok"], bool)
            and value["color"] in ("red", "green", "blue"))


def assert_healthy(llm, prompt="The cache") -> None:
    """The engine serves a plain request afterwards, and holds no request and no KV block."""
    from engine import SamplingParams

    output = llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True),
                          use_tqdm=False)[0]
    assert len(output.outputs[0].token_ids) == 3
    scheduler = llm.scheduler
    manager = scheduler.kv_cache_manager
    assert manager.num_free_blocks == manager.num_usable_blocks
    assert scheduler.get_num_unfinished_requests() == 0 and not llm.output_processor.has_unfinished_requests()
    assert llm.model_runner.grammar_req_ids == set()  # every matcher was dropped with its request
