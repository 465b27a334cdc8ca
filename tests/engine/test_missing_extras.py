"""A command that needs an extra the install lacks names the package and the extra, not a traceback.

Each case runs in a fresh interpreter with the package blocked (``sys.modules[name] = None`` makes its
import fail as a missing one does), since this process has every extra installed and imported."""

import subprocess
import sys
from pathlib import Path

import pytest

from engine.optional_dependencies import missing_extra_message

REPOSITORY = Path(__file__).resolve().parents[2]


def run_without(package: str, code: str, tmp_path: Path) -> subprocess.CompletedProcess:
    script = f"import sys; sys.modules[{package!r}] = None\n{code}"
    return subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env={"PYTHONPATH": str(REPOSITORY), "PATH": "/usr/bin:/bin"})


@pytest.mark.parametrize("package, code, expected", [
    ("torch", "from sim.run import main; sys.exit(main(['cpu_chat', '--executor', 'real', '--no-progress']))",
     "error: --executor real needs the 'torch' package, which this install lacks: install the 'real' extra"),
    ("fastapi", "import runpy; runpy.run_module('engine.serve', run_name='__main__')",
     "error: python -m engine.serve needs the 'fastapi' package, which this install lacks: install the 'real,serve' extra"),
])
def test_a_missing_extra_is_named_with_its_install_command(package, code, expected, tmp_path):
    result = run_without(package, code, tmp_path)
    assert result.returncode == 1, result.stderr
    assert expected in result.stderr
    assert "Traceback" not in result.stderr


def test_a_package_no_extra_provides_is_left_to_the_traceback():
    assert missing_extra_message(ModuleNotFoundError("no", name="torch.nn"), "x").startswith("x needs the 'torch'")
    assert missing_extra_message(ModuleNotFoundError("no", name="engine.typo"), "x") is None
    assert missing_extra_message(ModuleNotFoundError("no"), "x") is None


def test_without_xgrammar_only_structured_requests_are_refused(tiny_llama_path, monkeypatch):
    """The structured extra is optional: an engine without xgrammar serves everything else, and a structured
    request gets a ValueError naming the extra when it is added (the backend is imported on first use)."""
    from engine import LLM, SamplingParams, StructuredOutputsParams

    monkeypatch.setitem(sys.modules, "xgrammar", None)
    monkeypatch.delitem(sys.modules, "engine.runner.structured_output.xgrammar_backend", raising=False)
    llm = LLM(model=str(tiny_llama_path), max_num_seqs=2, max_model_len=64)
    plain = SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True)
    assert len(llm.generate(["fine"], plain, use_tqdm=False)[0].outputs[0].token_ids) == 2
    structured = SamplingParams(max_tokens=2, structured_outputs=StructuredOutputsParams(choice=["a"]))
    with pytest.raises(ValueError, match=r"prompt 0: SamplingParams\.structured_outputs: structured outputs needs "
                                         r"the 'xgrammar' package, .*install the 'structured' extra"):
        llm.generate(["fine"], structured, use_tqdm=False)
    assert len(llm.generate(["fine"], plain, use_tqdm=False)[0].outputs[0].token_ids) == 2
    assert llm.scheduler.get_num_unfinished_requests() == 0
