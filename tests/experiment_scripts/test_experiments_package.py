"""experiments/ is a package of scripts that use esjax's public API: no ``sys.path`` inserts, no private names of
esjax or envs (imported or reached as attributes), and what the scripts share lives in experiments/lib, which the
scripts import and which imports no script."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EXPERIMENTS = ROOT / "experiments"


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def problems(module: str, source: str) -> list[str]:
    """What breaks the rules in one module of experiments/ (``module``: its dotted name, e.g. experiments.report)."""
    found = []
    is_lib = module == "experiments.lib" or module.startswith("experiments.lib.")
    for node in ast.walk(ast.parse(source)):
        where = f"{module}:{getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.Attribute) and node.attr == "path" and isinstance(node.value, ast.Name) \
                and node.value.id == "sys":
            found.append(f"{where}: sys.path")
        elif isinstance(node, ast.Attribute) and node.attr == "spec_from_file_location":
            found.append(f"{where}: a module loaded by its file path")
        elif isinstance(node, ast.Attribute) and _private(node.attr) and not (
                isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
            found.append(f"{where}: private attribute .{node.attr}")
        if isinstance(node, ast.ImportFrom) and node.level:
            found.append(f"{where}: relative import")
            continue
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
            modules = names
        elif isinstance(node, ast.ImportFrom):
            names = [f"{node.module}.{alias.name}" for alias in node.names]
            modules = names if node.module == "experiments" else [node.module]
        else:
            continue
        found += [f"{where}: private name {name}" for name in names
                  if name.split(".")[0] in ("esjax", "envs") and any(_private(p) for p in name.split("."))]
        for name in modules:
            parts = name.split(".")
            if parts[0] == "experiments" and len(parts) > 1 and parts[1] != "lib":
                found.append(f"{where}: imports the script {'.'.join(parts[:2])}"
                             + (" (experiments.lib imports no script)" if is_lib else ""))
    return found


def test_the_rules_catch_what_they_name():
    bad = ("import sys\nsys.path.insert(0, 'x')\n"
           "from esjax.loop.rollout import _Replayed\n"
           "import esjax._private\n"
           "from experiments import report\n"
           "from experiments.staleness_grid import plan\n"
           "class E(Engine):\n    def pick(self):\n        return super()._choose(1), self._own, engine._calls\n")
    found = problems("experiments.foo", bad)
    assert sorted(f.split(": ", 1)[1] for f in found) == sorted([
        "sys.path", "private name esjax.loop.rollout._Replayed", "private name esjax._private",
        "imports the script experiments.report", "imports the script experiments.staleness_grid",
        "private attribute ._choose", "private attribute ._calls"])
    assert problems("experiments.foo", "from experiments.lib.grid import all_cells\nx = y.__doc__\n") == []


def test_experiments_use_public_names_and_share_only_through_lib():
    found = []
    modules = sorted(EXPERIMENTS.rglob("*.py"))
    assert EXPERIMENTS / "lib" / "__init__.py" in modules and EXPERIMENTS / "report.py" in modules
    for path in modules:
        parts = path.relative_to(ROOT).with_suffix("").parts
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found += problems(module, path.read_text())
    assert found == []
