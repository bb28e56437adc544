"""Tests and benchmarks reach the loop through its hooks (:mod:`esjax.train.hooks`) and public seams, never by
replacing a private name of esjax: a patched ``_method`` pins the implementation, so every refactoring breaks tests
that still pass against the old code path, and a benchmark that swaps private programs measures something the
package no longer runs.

Found by reading the source (``ast``): ``setattr(X, "_name", …)`` (``monkeypatch.setattr``, ``patch.setattr`` or
the builtin) where ``X`` is not imported from another package (``os``, ``sys``, …), and assignments
``X._name = …`` where ``X`` is a name imported from esjax (a module or a class, or an attribute path under one).
Dunders count: replacing ``Class.__init__`` is patching a private name too.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CHECKED = ("tests", "benchmarks")


def _imported_names(tree: ast.Module) -> tuple[set[str], set[str]]:
    """Local names bound by imports anywhere in the file (function-level imports too): (esjax's, every other's)."""
    esjax: set[str] = set()
    other: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                ours = alias.name == "esjax" or alias.name.startswith("esjax.")
                (esjax if ours else other).add(alias.asname or alias.name.split(".")[0])
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            ours = node.level == 0 and (module == "esjax" or module.startswith("esjax."))
            (esjax if ours else other).update(alias.asname or alias.name for alias in node.names)
    return esjax, other


def _root(node: ast.expr) -> str | None:
    while isinstance(node, ast.Attribute):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def private_patches(path: Path) -> list[str]:
    """``file:line: what`` for each private esjax name the file replaces."""
    tree = ast.parse(path.read_text(), filename=str(path))
    esjax, other = _imported_names(tree)
    found = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant)
                and isinstance(node.args[1].value, str) and node.args[1].value.startswith("_")
                and (isinstance(node.func, ast.Name) and node.func.id == "setattr"
                     or isinstance(node.func, ast.Attribute) and node.func.attr == "setattr")
                and _root(node.args[0]) not in other):  # esjax's, or a class handed in (``engine_cls``)
            found.append(f"{node.lineno}: setattr({ast.unparse(node.args[0])}, {node.args[1].value!r}, ...)")
        elif isinstance(node, (ast.Assign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for t in (target.elts if isinstance(target, ast.Tuple) else [target]):
                    if isinstance(t, ast.Attribute) and t.attr.startswith("_") and _root(t) in esjax:
                        found.append(f"{node.lineno}: {ast.unparse(t)} = ...")
    return [f"{path.name}:{line}" for line in sorted(found, key=lambda hit: int(hit.split(":")[0]))]


def test_no_test_or_benchmark_patches_a_private_esjax_name():
    files = [p for folder in CHECKED for p in sorted((REPO / folder).rglob("*.py"))]
    assert len(files) > 50  # the folders were found
    found = [hit for path in files for hit in private_patches(path)]
    assert not found, "private esjax names replaced (use a hook or a public seam):\n" + "\n".join(found)


def test_the_check_sees_each_way_of_patching(tmp_path):
    """The detector itself: each form below is a patch of a private esjax name; the public ones are not."""
    sample = tmp_path / "sample.py"
    sample.write_text(
        "import esjax.agent.lanes as lanes\n"
        "from esjax.loop.rollout import RolloutEngine\n"
        "from esjax.train import trainer\n"
        "import os\n"
        "def test(monkeypatch):\n"
        "    monkeypatch.setattr(RolloutEngine, '_calls', None)\n"  # 6
        "    monkeypatch.setattr(RolloutEngine, '__init__', None)\n"  # 7
        "    lanes._decode = None\n"  # 8
        "    trainer.Trainer._save = None\n"  # 9
        "    lanes._a, lanes.b = 1, 2\n"  # 10
        "    monkeypatch.setattr(RolloutEngine, 'tick', None)\n"  # public: fine
        "    monkeypatch.setattr(os, '_exit', None)\n"  # not esjax
        "    def f(engine_cls): monkeypatch.setattr(engine_cls, '_retire', None)\n"  # 13: a class handed in
        "    self_like = object(); self_like._x = 1\n")  # not an esjax name
    assert [hit.split(":")[1] for hit in private_patches(sample)] == ["6", "7", "8", "9", "10", "13"]
