"""The layout rules of gradexp/, read from the code (nothing is imported or run):

    size       no module longer than LIMIT lines
    cycles     no import cycle among gradexp's modules (imports inside functions count; the
               package's own __init__ is left out: re-exporting is not a cycle of concerns)
    training   nothing `gradexp.train` reaches by its imports is on the analysis side, pandas
               or matplotlib: a run never pays for the summary's imports
    folders    gradexp/ is grouped by concern, and imports run one way between the folders
               (FOLDERS): a module of a folder imports, of gradexp, its own folder, the folders
               listed for it and the package itself; the run directory's contract (runs) and
               the config import no TensorFlow (they answer before it loads), the analysis
               reads run directories only; the entry points at the top (train, summarize, api,
               keras, layers, docs_gen) and bench/ may import any folder, and no folder imports
               them; a folder not listed is a breach

`problems(root)` lists every breach as one line; tests/test_layout.py checks that gradexp has
none, and that a package made to break each rule is reported.
"""

from __future__ import annotations

import ast
from pathlib import Path

LIMIT = 450
ENTRY = "gradexp.train"
NOT_FROM_TRAINING = ("gradexp.analysis", "pandas", "matplotlib")
TF = "gradexp._tf"  # the one place TensorFlow is imported (quietly)
FOLDERS = {  # each folder, in order, with what it may import besides itself and `gradexp`
    "gradexp.runs": (),
    "gradexp.config": ("gradexp.runs",),
    "gradexp.parts": ("gradexp.runs", "gradexp.config", TF),
    "gradexp.training": ("gradexp.runs", "gradexp.config", "gradexp.parts", TF),
    "gradexp.sweeps": ("gradexp.runs", "gradexp.config", "gradexp.parts", "gradexp.training", TF),
    "gradexp.analysis": ("gradexp.runs", TF),  # _tf: event files of a run without metrics.csv
}
TOP = ("gradexp.bench",)  # folders of entry points, like the top's modules: may import any


def modules(root: Path, package: str = "gradexp") -> dict[str, Path]:
    """Every module of the package under `root`, by its dotted name."""
    out = {}
    for path in sorted((root / package).rglob("*.py")):
        name = ".".join(path.relative_to(root).with_suffix("").parts)
        out[name.removesuffix(".__init__")] = path
    return out


def _named(node: ast.AST, here: str, is_package: bool) -> list[str]:
    """The dotted names an import statement names (a `from` import: the module and each name)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    base = node.module or ""
    if node.level:  # relative: from the package of `here`
        parts = here.split(".") if is_package else here.split(".")[:-1]
        parts = parts[: len(parts) - (node.level - 1)]
        base = ".".join(parts + ([base] if base else []))
    return [base] + [f"{base}.{alias.name}" for alias in node.names]


def imports(mods: dict[str, Path]) -> dict[str, set[str]]:
    """Each module's imports: the package's modules it names, and other top-level packages."""
    graph = {}
    for name, path in mods.items():
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            for target in _named(node, name, path.name == "__init__.py"):
                top = target.split(".")[0]
                if top not in {m.split(".")[0] for m in mods}:
                    found.add(top)
                    continue
                while target and target not in mods:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    found.add(target)
        graph[name] = found
    return graph


def too_long(mods: dict[str, Path], limit: int = LIMIT) -> list[str]:
    lengths = {name: len(path.read_text().splitlines()) for name, path in mods.items()}
    return [f"{name}: {n} lines, over {limit}" for name, n in sorted(lengths.items()) if n > limit]


def cycles(graph: dict[str, set[str]], package: str = "gradexp") -> list[str]:
    """Each import cycle among the package's modules, once, as `a -> b -> a`."""
    found, state = [], {}

    def visit(node: str, stack: list[str]) -> None:
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in graph or package in (nxt, node):
                continue
            if state.get(nxt) == "open":
                found.append(" -> ".join(stack[stack.index(nxt):] + [nxt]))
            elif nxt not in state:
                visit(nxt, stack)
        stack.pop()
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [])
    return found


def reached(graph: dict[str, set[str]], start: str) -> dict[str, list[str]]:
    """Everything `start` reaches by imports, each with the chain that reaches it."""
    paths, todo = {start: [start]}, [start]
    while todo:
        node = todo.pop(0)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in paths:
                paths[nxt] = paths[node] + [nxt]
                todo.append(nxt)
    return paths


def _under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def training_imports(graph: dict[str, set[str]], entry: str = ENTRY) -> list[str]:
    return [f"{entry} reaches {name}: {' -> '.join(chain)}"
            for name, chain in sorted(reached(graph, entry).items())
            if any(_under(name, banned) for banned in NOT_FROM_TRAINING)]


def folder_imports(graph: dict[str, set[str]], package: str = "gradexp") -> list[str]:
    out = []
    for name, targets in sorted(graph.items()):
        folder = ".".join(name.split(".")[:2])
        if name.count(".") < 2 and folder not in FOLDERS:  # a module at the top
            continue
        if folder in TOP:
            continue
        if folder not in FOLDERS:
            out.append(f"{name}: in {folder}, a folder the layout does not place (FOLDERS)")
            continue
        allowed = FOLDERS[folder]
        for target in sorted(targets):
            if (_under(target, package) and target != package and not _under(target, folder)
                    and not any(_under(target, a) for a in allowed)):
                out.append(f"{name} imports {target}: {folder} may import only "
                           f"{', '.join(allowed) or 'no other gradexp module'}")
    return out


def problems(root: Path, limit: int = LIMIT) -> list[str]:
    mods = modules(root)
    graph = imports(mods)
    return [*too_long(mods, limit), *(f"cycle: {c}" for c in cycles(graph)),
            *training_imports(graph), *folder_imports(graph)]
