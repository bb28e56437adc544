"""The import structure of esjax/ and envs/: no cycles, and no import runs up the layers.

Every ``import`` and ``from … import`` statement counts, wherever it stands: at the top, inside a function or
under ``if TYPE_CHECKING:`` (a guarded import is still a dependency a reader has to follow). An edge goes to the
module the statement names: ``from esjax.es import shaping`` to ``esjax.es.shaping`` when that is a module,
else to the package's ``__init__``.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _modules() -> dict[str, tuple[Path, bool]]:
    mods = {}
    for top in ("esjax", "envs"):
        for path in (ROOT / top).rglob("*.py"):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            is_pkg = parts[-1] == "__init__"
            mods[".".join(parts[:-1] if is_pkg else parts)] = (path, is_pkg)
    return mods


def import_graph() -> dict[str, set[str]]:
    """Module -> the esjax/envs modules it imports (all import statements, TYPE_CHECKING-guarded included)."""
    mods = _modules()

    def known(name: str | None) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph = {}
    for name, (path, is_pkg) in mods.items():
        package = name if is_pkg else name.rpartition(".")[0]
        out = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                out.update(known(a.name) for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    source = ".".join(base + ([node.module] if node.module else []))
                else:
                    source = node.module
                out.update(f"{source}.{a.name}" if f"{source}.{a.name}" in mods else known(source)
                           for a in node.names)
        out.discard(None)
        out.discard(name)
        graph[name] = out
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycles():
    graph = import_graph()
    assert "esjax.es.step" in graph and "envs.webshop_bridge.shop" in graph
    assert cycles(graph) == []


#: esjax's layers, lowest first: a module may import its own layer and those below, never one above. The task seam
#: (esjax.task) sits under the config, which validates each task's own env keys. Task packages (envs/) stand above
#: the whole core: they import it, nothing under esjax/ imports them (a config names a task; esjax.task imports it
#: by name). The command-line programs (ENTRY_POINTS) may import anything of esjax.
LAYERS = [
    ("esjax", "esjax.errors"),
    ("esjax.es",),
    ("esjax.model",),
    ("esjax.agent",),
    ("esjax.loop",),
    ("esjax.parallel", "esjax.plan"),
    ("esjax.task",),
    ("esjax.config",),
    ("esjax.rundir",),
    ("esjax.train",),
    ("esjax.cli",),
    ("envs",),
]
ENTRY_POINTS = {"esjax.run", "esjax.eval", "esjax.export", "esjax.convert", "esjax.plan.__main__",
                "esjax.parallel.smoke"}


def layer_of(module: str) -> int:
    if module in ENTRY_POINTS:
        return LAYERS.index(("esjax.cli",))
    owner = max((p for layer in LAYERS for p in layer if module == p or module.startswith(p + ".")), key=len)
    return next(i for i, layer in enumerate(LAYERS) if owner in layer)


def test_no_import_runs_up_the_layers():
    graph = import_graph()
    upward = [f"{a} -> {b}" for a, targets in sorted(graph.items()) for b in sorted(targets)
              if layer_of(b) > layer_of(a)]
    assert upward == []
    tops = {m.split(".")[1] for m in graph if m.startswith("esjax.") and m.count(".") == 1 and m not in ENTRY_POINTS}
    assert tops <= {"errors", "es", "model", "agent", "loop", "parallel", "plan", "task", "config", "rundir", "train",
                    "cli"}


def test_nothing_under_esjax_imports_a_task():
    """The core stops knowing WebShop (issue 55): no module under esjax/ imports envs/ (any task package), at the
    top, inside a function or under TYPE_CHECKING; a config names its task and esjax.task imports it by name."""
    graph = import_graph()
    assert "envs.webshop_bridge.task" in graph and "esjax.task" in graph
    into_tasks = [f"{a} -> {b}" for a, targets in sorted(graph.items()) if a.startswith("esjax")
                  for b in sorted(targets) if b == "envs" or b.startswith("envs.")]
    assert into_tasks == []
    assert "esjax.task" in graph["envs.webshop_bridge.task"]  # the other way round is how a task plugs in
