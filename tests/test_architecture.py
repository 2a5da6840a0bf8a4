"""The import graph of the repository, read with ``ast`` (nothing is imported): method files are leaves and
nothing imports in a circle.

- Edges are every import of a module of this repository: at module level, inside functions, and
  ``importlib.import_module("literal")``. ``from package import name`` is an edge to ``package.name`` when that
  is a module.
- No cycle among them, whether the imports run at import time or only when a function is called.
- Method files (the root files the registry names; fastrg.py and alibi.py, the leaves they share) and
  baselines/ import nothing from bench, except in the ``main()`` of a method file, which hands the file to the
  harness in at most MAIN_LINES lines.
"""
import ast
from pathlib import Path

from bench import methods

ROOT = Path(__file__).resolve().parents[1]
MAIN_LINES = 10


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def sources() -> dict:
    """module name → path, for the root files, baselines/ and bench/ (tests and benchmarks are not part of it)."""
    paths = [*ROOT.glob("*.py"), *(ROOT / "baselines").rglob("*.py"), *(ROOT / "bench").rglob("*.py")]
    return {module_name(p): p for p in paths}


def imports(path: Path, known: set) -> list:
    package = module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
    return imports_in(path.read_text(), package, known)


def imports_in(text: str, package: str, known: set) -> list:
    """(imported module, enclosing top-level function or None, line) for each import of a module in ``known``
    by the source ``text`` of a module in ``package``."""
    tree = ast.parse(text)
    found = []

    def add(name, scope, line):
        while name and name not in known:  # bench.train.x → bench.train
            name = name.rpartition(".")[0]
        if name:
            found.append((name, scope, line))

    def visit(node, scope):
        for child in ast.iter_child_nodes(node):
            inner = scope
            if scope is None and isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                inner = child.name if not isinstance(child, ast.ClassDef) else None
            if isinstance(child, ast.Import):
                for alias in child.names:
                    add(alias.name, scope, child.lineno)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    anchor = package.split(".")[:len(package.split(".")) - child.level + 1]
                    base = ".".join([*anchor, *([base] if base else [])])
                for alias in child.names:
                    target = f"{base}.{alias.name}" if base else alias.name
                    add(target if target in known else base, scope, child.lineno)
            elif (isinstance(child, ast.Call) and isinstance(child.func, ast.Attribute)
                  and child.func.attr == "import_module" and child.args
                  and isinstance(child.args[0], ast.Constant) and isinstance(child.args[0].value, str)):
                add(child.args[0].value, scope, child.lineno)
            visit(child, inner)

    visit(tree, None)
    return found


def graph() -> dict:
    modules = sources()
    known = set(modules)
    return {name: imports(path, known) for name, path in modules.items()}


def cycles(edges: dict) -> list:
    """Each strongly connected component of more than one module (or a module importing itself), sorted."""
    index, low, stack, on_stack, found, counter = {}, {}, [], set(), [], [0]

    def connect(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted({target for target, _, _ in edges.get(v, [])}):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1 or any(t == v for t, _, _ in edges.get(v, [])):
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            connect(v)
    return sorted(found)


def leaves() -> list:
    """The root modules (method files, fastrg.py, alibi.py) and baselines/: torch, numpy and each other only."""
    return sorted(name for name in sources() if "." not in name or name.startswith("baselines"))


def test_the_import_graph_has_no_cycle():
    found = cycles(graph())
    assert found == []


def test_method_files_and_baselines_import_bench_only_in_main():
    edges = graph()
    offending = [f"{name}:{line} imports {target} ({f'in {scope}()' if scope else 'at module level'})"
                 for name in leaves() for target, scope, line in edges[name]
                 if target.split(".")[0] == "bench" and scope != "main"]
    assert offending == []


def test_each_method_file_hands_itself_to_the_harness_in_a_short_main():
    registered = {m.attention.split(":")[0] for m in methods.REGISTRY}
    files = [ROOT / f"{name}.py" for name in leaves() if "." not in name and name in registered]
    assert {f.name for f in files} >= {"sbm_transformer.py", "ssa.py", "kernel_sparse.py"}
    lengths = {}
    for path in files:
        tree = ast.parse(path.read_text())
        main = [node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == "main"]
        if main:
            lengths[path.name] = main[0].end_lineno - main[0].lineno + 1
    assert lengths and all(n <= MAIN_LINES for n in lengths.values()), lengths


def test_the_walk_sees_imports_inside_functions_and_through_importlib():
    """The checks above are only as good as the walk: it must find each kind of import, and each cycle."""
    text = ("import importlib\nfrom bench import train\nimport bench.measure as m\n\n\n"
            "def f():\n    from .tasks import get_task\n    importlib.import_module('bench.model')\n")
    known = {"bench", "bench.train", "bench.tasks", "bench.model", "bench.measure"}
    assert {(t, s) for t, s, _ in imports_in(text, "bench", known)} == {
        ("bench.train", None), ("bench.measure", None), ("bench.tasks", "f"), ("bench.model", "f")}
    assert cycles({"a": [("b", None, 1)], "b": [("a", "f", 2)], "c": [("a", None, 3)]}) == [["a", "b"]]
    assert cycles({"a": [("b", None, 1)], "b": []}) == []
