"""``python -m engine.serve``'s flags: a bad one is one ``error:`` line naming the flag and the value, exit
status 2, before any model loads (``main`` is called in-process: each case takes milliseconds)."""

import pytest

from engine.serve.cli import main, make_parser
from tests.serve.serve_helpers import run_cli

# Every test here calls main(): a flag that slipped through must fail, not start a server (conftest.py).
pytestmark = pytest.mark.usefixtures("never_serve")


@pytest.mark.parametrize("argv,message", [
    (["--max-num-seqs", "0"], "error: --max-num-seqs must be >= 1, got 0"),
    (["--max-num-seqs", "-4"], "error: --max-num-seqs must be >= 1, got -4"),
    (["--max-num-batched-tokens", "0"], "error: --max-num-batched-tokens must be >= 1, got 0"),
    (["--max-model-len", "-1"], "error: --max-model-len must be >= 1, got -1"),
    (["--block-size", "0"], "error: --block-size must be >= 1, got 0"),
    (["--num-gpu-blocks", "1"], "error: --num-gpu-blocks must be >= 2, got 1"),
    (["--port", "65536"], "error: --port must be in [0, 65535], got 65536"),
    (["--port", "-1"], "error: --port must be in [0, 65535], got -1"),
    (["--seed", str(2**64)], f"error: --seed must be in [{-2**63}, {2**64 - 1}], got {2**64}"),
    (["--gpu-memory-utilization", "1.5"], "error: --gpu-memory-utilization must be in (0, 1], got 1.5"),
    (["--kv-offloading-size", "-2"], "error: --kv-offloading-size must be a number of GiB >= 0, got -2.0"),
    (["--kv-offloading-size", "4", "--no-enable-prefix-caching"], "error: --kv-offloading-size needs prefix caching"),
    (["--host", "999.1.1.1"], "error: --host '999.1.1.1' is not an address to listen on"),
    (["--tokenizer", "/nonexistent"], "error: --tokenizer '/nonexistent' is not a folder"),
    (["--enable-auto-tool-choice"], "error: --enable-auto-tool-choice needs --tool-call-parser NAME"),
    (["--tool-call-parser", "nope"], "error: --tool-call-parser 'nope' is not a known parser; known: deepseek_v3, deepseek_v31, glm45, hermes"),
    (["--max-num-seqs", "many"], "error: argument --max-num-seqs: invalid int value: 'many'"),
    (["--scheduling-policy", "lifo"], "error: --scheduling-policy must be one of 'fcfs', 'priority', "
                                      "'shortest_prompt_first', 'shortest_output_first', or 'module:function'"),
    (["--scheduling-policy", "tests.core.rank_functions:nope"], "error: --scheduling-policy must be "
                                                                "'module:function' naming a callable"),
    (["--prefix-cache-eviction-policy", "mru"], "error: --prefix-cache-eviction-policy must be one of 'lru', 'lfu', "
                                                "or 'module:Class'"),
])
def test_bad_flags_are_one_line_errors(tiny_model_path, capsys, argv, message):
    status, err = run_cli(["--model", str(tiny_model_path), *argv], capsys)
    assert status == 2 and err.startswith(message) and err.count("\n") == 1, err


def test_an_unchunked_budget_below_max_model_len_is_refused(tiny_model_path, capsys):
    """The engine would lower max_model_len to the budget unasked (/v1/models then said 16, and a 21-token
    prompt was refused "more than 16 (max_model_len=2048)"); refused up front, as sim.run and vLLM do."""
    argv = ["--model", str(tiny_model_path), "--no-enable-chunked-prefill", "--max-num-batched-tokens", "16"]
    status, err = run_cli(argv, capsys)
    assert status == 2 and err.startswith("error: --max-num-batched-tokens must be >= max_model_len (2048, "
                                          "the model's) with --no-enable-chunked-prefill, got 16"), err
    status, err = run_cli([*argv, "--max-model-len", "64"], capsys)
    assert status == 2 and "max_model_len (64, --max-model-len)" in err, err


def test_a_folder_without_a_tokenizer_names_the_flag(tiny_model_path, tmp_path, capsys):
    status, err = run_cli(["--model", str(tiny_model_path), "--tokenizer", str(tmp_path)], capsys)
    assert status == 2 and err.count("\n") == 1, err
    assert err.startswith(f"error: cannot load a tokenizer from {str(tmp_path)!r} (--tokenizer): no tokenizer.json")
    assert "tokenizer=<folder>" not in err and "sentencepiece" not in err


def test_help_states_each_default_once():
    help_text = " ".join(make_parser().format_help().split())
    assert "(default: None)" not in help_text
    assert "tokenizer folder (default: the model's) --served-model-name" in help_text
    assert "0-65535; 0 picks a free port (default: 8000)" in help_text


def test_a_bad_speculative_config_names_the_flag_and_key(capsys):
    with pytest.raises(SystemExit):
        main(["--model", "tiny", "--speculative-config", '{"num_speculative_tokens": 0}'])
    assert "--speculative-config: speculative_config.num_speculative_tokens must be an integer >= 1, got 0" \
        in capsys.readouterr().err
