"""engine/core imports neither torch nor simpy (nor anything above it): both executors share it."""

from __future__ import annotations

import ast
import pathlib
import subprocess
import sys

CORE = pathlib.Path(__file__).resolve().parents[2] / "engine" / "core"
FORBIDDEN = {"torch", "simpy", "sim", "analysis", "workloads", "kernels", "triton", "transformers", "xgrammar"}


def test_importing_the_core_loads_no_torch_or_simpy():
    code = ("import sys, engine.core, engine.core.scheduler, engine.core.engine_core;"
            "bad = sorted(m for m in ('torch', 'simpy', 'numpy', 'pandas') if m in sys.modules);"
            "print(','.join(bad))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert loaded == ""


def test_no_core_file_imports_a_forbidden_package():
    offenders = []
    for path in sorted(CORE.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            offenders += [f"{path.name}: {name}" for name in names
                          if name.split(".")[0] in FORBIDDEN or name.startswith("engine.runner")]
    assert offenders == []
