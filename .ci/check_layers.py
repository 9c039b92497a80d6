"""Fail when wflow's import graph decays: an import running back up the layer order,
an import circle between files, or a module using another module's private name.

Run from the repository root: ``python .ci/check_layers.py``.  The layers (lowest first)
are listed in ``LAYERS``; a module may import modules of its own layer or of lower ones,
and within one layer the imports must not form a circle.  Imports inside functions count
like the others: a lazy import that runs back up is still a dependency on the layer above.
"""

from __future__ import annotations

import ast
import sys
from collections import defaultdict
from pathlib import Path

# Lowest first.  A package name covers its submodules unless a submodule is listed itself.
LAYERS: list[tuple[str, ...]] = [
    ("wflow._version", "wflow._typing", "wflow.errors"),
    ("wflow.sphere", "wflow.theory", "wflow.io"),
    ("wflow.measure", "wflow.mesh", "wflow.linkage"),
    ("wflow.kernels", "wflow.density", "wflow.transport"),
    ("wflow.models", "wflow.schemes", "wflow.zonal"),
    ("wflow.diagnostics", "wflow.stability", "wflow.pretrained"),
    ("wflow.solvers",),
    ("wflow.config", "wflow.build", "wflow.runfolder", "wflow.plot", "wflow.perceptron_paper"),
    ("wflow.sweep",),
    ("wflow.studies",),
    ("wflow.cli", "wflow"),
]


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def layer_of(name: str) -> int:
    best, depth = None, -1
    for i, group in enumerate(LAYERS):
        for prefix in group:
            if (name == prefix or name.startswith(prefix + ".")) and prefix.count(".") > depth:
                best, depth = i, prefix.count(".")
    if best is None:
        raise SystemExit(f"check_layers: module {name} is in no layer; add it to LAYERS")
    return best


def resolve(name: str, is_pkg: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = name.split(".") if is_pkg else name.split(".")[:-1]
    base = base[: len(base) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def main(root: Path = Path("wflow")) -> int:
    files = {module_name(p, root): p for p in sorted(root.rglob("*.py"))}
    edges: dict[str, set[str]] = defaultdict(set)
    problems: list[str] = []
    for name, path in files.items():
        is_pkg = path.name == "__init__.py"
        tree = ast.parse(path.read_text(), filename=str(path))
        aliases: dict[str, str] = {}  # local name -> wflow module it is bound to
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                target = resolve(name, is_pkg, node)
                if target != "wflow" and not target.startswith("wflow."):
                    continue
                for a in node.names:
                    full = f"{target}.{a.name}"
                    if full in files:  # a submodule
                        edges[name].add(full)
                        aliases[a.asname or a.name] = full
                        continue
                    edges[name].add(target)
                    private = a.name.startswith("_") and not a.name.startswith("__")
                    if private and target != name:
                        problems.append(
                            f"{path}:{node.lineno}: imports private name {a.name} of {target}"
                        )
            elif isinstance(node, ast.Import):
                for a in node.names:
                    if a.name.startswith("wflow"):
                        edges[name].add(a.name)
                        if a.asname:
                            aliases[a.asname] = a.name
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id in aliases
                and node.attr.startswith("_")
                and not node.attr.startswith("__")
                and aliases[node.value.id] != name
            ):
                problems.append(
                    f"{path}:{node.lineno}: uses private name {node.attr} of "
                    f"{aliases[node.value.id]}"
                )
    for name, targets in sorted(edges.items()):
        for target in sorted(targets):
            if target == name or target not in files:
                continue
            if layer_of(target) > layer_of(name):
                problems.append(
                    f"{files[name]}: {name} (layer {layer_of(name)}) imports {target} "
                    f"(layer {layer_of(target)}), which is above it"
                )
    for cycle in circles({k: {t for t in v if t in files and t != k} for k, v in edges.items()}):
        problems.append("import circle: " + " -> ".join(cycle + [cycle[0]]))
    for p in problems:
        print(p)
    print(f"check_layers: {len(files)} modules, {len(problems)} problem(s)")
    return 1 if problems else 0


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    sys.setrecursionlimit(10_000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


if __name__ == "__main__":
    sys.exit(main())
