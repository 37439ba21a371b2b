"""The import graph of ``specdec`` read statically (``ast``): no cycles, and the dependency direction
of ARCHITECTURE.md ("Dependency direction").

Every ``import`` counts, at module level and inside functions: a function-local import hides a cycle
from the interpreter, not from the design. An edge goes to the module named (``from pkg import sub``
→ ``pkg.sub`` when that is a module, else ``pkg``); importing ``a.b.c`` also runs ``a/__init__`` and
``a/b/__init__``, but those implicit parent edges are left out, as import-linter and pydeps do —
with them every module would sit in one cycle through ``specdec/__init__``.
"""

from __future__ import annotations

import ast
import pkgutil
import sys
from collections import deque
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import specdec

PACKAGE_DIR = Path(specdec.__file__).parent


@dataclass(frozen=True)
class Edge:
    source: str
    target: str
    line: int

    def __str__(self) -> str:
        return f"{self.source} -> {self.target} ({module_file(self.source)}:{self.line})"


def iter_module_names(path: list[str] | None = None, prefix: str = "specdec.") -> list[str]:
    """Every module and package under ``specdec/``, found with pkgutil without importing any."""
    names = ["specdec"] if path is None else []
    for info in pkgutil.iter_modules(path or specdec.__path__, prefix):
        names.append(info.name)
        if info.ispkg:
            sub = PACKAGE_DIR.joinpath(*info.name.split(".")[1:])
            names += iter_module_names([str(sub)], info.name + ".")
    return sorted(names)


def module_file(name: str) -> Path:
    parts = name.split(".")[1:]
    base = PACKAGE_DIR.joinpath(*parts)
    path = base / "__init__.py" if base.is_dir() else base.with_suffix(".py")
    return path.relative_to(PACKAGE_DIR.parent)


def _imported_names(module: str, node: ast.Import | ast.ImportFrom) -> list[str]:
    """Absolute dotted names an import statement refers to (``from x import y`` gives ``x.y``)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if node.level:  # relative: resolve against the importing module's package
        is_package = module_file(module).name == "__init__.py"
        package = module.split(".") if is_package else module.split(".")[:-1]
        base = ".".join(package[: len(package) - (node.level - 1)])
        origin = f"{base}.{node.module}" if node.module else base
    else:
        origin = node.module or ""
    return [f"{origin}.{alias.name}" for alias in node.names] + [origin]


@cache
def parsed(module: str) -> ast.Module:
    return ast.parse((PACKAGE_DIR.parent / module_file(module)).read_text(), str(module_file(module)))


@cache
def import_graph() -> dict[str, tuple[Edge, ...]]:
    """module -> its edges to other specdec modules (one per target, the first line that imports it)."""
    modules = set(iter_module_names())
    graph: dict[str, tuple[Edge, ...]] = {}
    for module in sorted(modules):
        edges: dict[str, Edge] = {}
        for node in ast.walk(parsed(module)):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            names = _imported_names(module, node)
            if isinstance(node, ast.ImportFrom):  # ``from pkg import sub``: the submodule if it is one
                origin, subs = names[-1], [n for n in names[:-1] if n in modules]
                names = subs if len(subs) == len(node.names) else [*subs, origin]
            for name in names:
                while name and name not in modules:  # ``import a.b.attr`` style: the longest module
                    name = name.rpartition(".")[0]
                if name and name != module and name not in edges:
                    edges[name] = Edge(module, name, node.lineno)
        graph[module] = tuple(sorted(edges.values(), key=lambda e: e.target))
    return graph


def third_party_imports(module: str) -> dict[str, int]:
    """Top-level names of non-specdec, non-stdlib packages a module imports -> first line."""
    found: dict[str, int] = {}
    for node in ast.walk(parsed(module)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names = [node.module]
        else:
            continue
        for name in names:
            top = name.partition(".")[0]
            if top != "specdec" and top not in sys.stdlib_module_names:
                found.setdefault(top, node.lineno)
    return found


# --- cycles ------------------------------------------------------------------------------------


def strongly_connected_components(graph: dict[str, tuple[Edge, ...]]) -> list[list[str]]:
    """Tarjan's algorithm, iterative; components of one module without a self-edge are left out."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(graph[root]))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            for edge in edges:
                if edge.target not in index:
                    index[edge.target] = low[edge.target] = len(index)
                    stack.append(edge.target)
                    on_stack.add(edge.target)
                    work.append((edge.target, iter(graph[edge.target])))
                    break
                if edge.target in on_stack:
                    low[node] = min(low[node], index[edge.target])
            else:
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
                        components.append(sorted(component))
    return sorted(components)


def shortest_path(graph: dict[str, tuple[Edge, ...]], start: str, goal: set[str], within: set[str] | None = None) -> list[Edge] | None:
    """The fewest edges from ``start`` to any module in ``goal`` (optionally staying ``within``)."""
    came_from: dict[str, Edge | None] = {start: None}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        for edge in graph[node]:
            if edge.target in came_from and edge.target not in goal:
                continue
            if within is not None and edge.target not in within:
                continue
            if edge.target in goal:
                path = [edge]
                while (back := came_from[path[0].source]) is not None:
                    path.insert(0, back)
                return path
            came_from[edge.target] = edge
            queue.append(edge.target)
    return None


def describe_cycles(graph: dict[str, tuple[Edge, ...]]) -> list[str]:
    """One paragraph per strongly connected component: its modules and the shortest cycle through
    each of them (distinct cycles only), every edge with the line that makes it."""
    report = []
    for component in strongly_connected_components(graph):
        members = set(component)
        cycles: dict[frozenset, list[Edge]] = {}
        for module in component:
            path = shortest_path(graph, module, {module}, within=members)
            assert path is not None
            cycles.setdefault(frozenset((e.source, e.target) for e in path), path)
        lines = [f"cycle of {len(component)} modules: {', '.join(component)}"]
        for path in sorted(cycles.values(), key=len):
            lines.append("  " + " -> ".join([path[0].source] + [e.target for e in path]))
            lines += [f"      {edge}" for edge in path]
        report.append("\n".join(lines))
    return report


def test_the_graph_sees_every_module_and_function_local_imports():
    graph = import_graph()
    assert "specdec.engine" in graph and "specdec.verify" in graph and "specdec.drafters.base" in graph
    assert len(graph) == len(iter_module_names()) >= 40
    # specdec.cli.serve imports the server inside its run() only: a function-local edge is seen
    assert "specdec.server.app" in {edge.target for edge in graph["specdec.cli.serve"]}


def test_cycle_finder_reports_a_known_cycle():
    """The cycle finder itself, on a made-up graph: a -> b -> c -> a and d -> d are found, e is not."""
    def edges(source, *targets):
        return tuple(Edge(source, target, 1) for target in targets)
    graph = {"a": edges("a", "b"), "b": edges("b", "c", "e"), "c": edges("c", "a"), "e": (), "d": edges("d", "e")}
    assert strongly_connected_components(graph) == [["a", "b", "c"]]
    assert [e.target for e in shortest_path(graph, "a", {"a"})] == ["b", "c", "a"]


def test_no_import_cycles():
    cycles = describe_cycles(import_graph())
    assert not cycles, "import cycles in specdec:\n" + "\n".join(cycles)


# --- dependency direction (ARCHITECTURE.md) ----------------------------------------------------
#
#   cli/server -> {tune, bench, certify} -> scheduler -> engine -> {verify, drafters, backends,
#   tokenizer/compat};  drafters -> backends;  backends -> models -> kernels.  Never the other way.
#
# A rule reads: modules under <layer> must not reach <forbidden> — directly or through any chain of
# imports (the report shows the chain).

ENTRY_POINTS = ("specdec.cli", "specdec.server", "specdec.__main__")
MODEL_FREE = ("specdec.drafters", "specdec.models", "specdec.backends")
LOOP = ("specdec.engine", "specdec.rounds", "specdec.api", "specdec.loading", "specdec.server", "specdec.cli", "specdec.bench", "specdec.train")

LAYER_RULES = [
    # layer               must not reach                                              because
    ("specdec.verify",   MODEL_FREE,                                                  "verify works on probabilities: no drafter, no model"),
    ("specdec.models",   (*LOOP, "specdec.drafters", "specdec.backends"),              "models know no loop and no drafter"),
    ("specdec.kernels",  ("specdec.models", "specdec.backends", "specdec.engine", "specdec.drafters",
                          "specdec.api", "specdec.loading", "specdec.server", "specdec.cli"),            "kernels are the bottom layer"),
    ("specdec.drafters", ("specdec.engine", "specdec.api", "specdec.loading", "specdec.cli", "specdec.server", "specdec.bench",
                          "specdec.calibrate", "specdec.train"),                      "drafters do not drive the loop"),
    ("specdec.engine",   ("specdec.api", "specdec.loading", "specdec.server", "specdec.cli", "specdec.bench", "specdec.certify",
                          "specdec.calibrate", "specdec.train"),                      "the loop knows nothing above it"),
    ("specdec.rounds",   ("specdec.engine", "specdec.api", "specdec.server", "specdec.cli", "specdec.bench",
                          "specdec.certify", "specdec.calibrate", "specdec.train"),   "a round's steps are the loop's parts"),
    ("specdec.backends", (*LOOP, "specdec.drafters", "specdec.calibrate"),            "backends run a model; no loop, no drafter"),
    ("specdec.server",   ("specdec.cli",),                                            "the server is started by the CLI, not the reverse"),
    ("specdec",          ENTRY_POINTS,                                                "only entry points import entry points"),
]
#: third-party packages that speak HTTP as a server: cli/server only (bench's urllib client talking to
#: a llama.cpp peer is a measurement, not serving)
WEB_FRAMEWORKS = ("fastapi", "uvicorn", "starlette")
#: writes to a screen below cli/server that are deliberate, with why (keep this table short)
ALLOWED_SCREEN_WRITES = {
    "specdec.models.registry": "the tqdm bar of `pull(progress=True)`, on stderr, asked for by the CLI",
}


def _in(module: str, layer: str | tuple[str, ...]) -> bool:
    layers = (layer,) if isinstance(layer, str) else layer
    return any(module == name or module.startswith(name + ".") for name in layers)


def layer_violations(graph: dict[str, tuple[Edge, ...]]) -> list[str]:
    """Every import that crosses into a forbidden module, reached from a rule's layer by a chain
    that crosses nothing forbidden before it; one example chain each."""
    found = []
    for layer, forbidden, why in LAYER_RULES:
        exempt = ENTRY_POINTS if layer == "specdec" else ()
        starts = [m for m in graph if _in(m, layer) and not _in(m, exempt) and not _in(m, forbidden)]
        came_from: dict[str, Edge | None] = {m: None for m in starts}
        queue = deque(starts)
        crossings: list[Edge] = []
        while queue:
            for edge in graph[queue.popleft()]:
                if _in(edge.target, forbidden):
                    crossings.append(edge)
                elif edge.target not in came_from:
                    came_from[edge.target] = edge
                    queue.append(edge.target)
        for edge in crossings:
            chain = [edge]
            while (back := came_from[chain[0].source]) is not None:
                chain.insert(0, back)
            names = " -> ".join([chain[0].source] + [e.target for e in chain])
            found.append(f"{edge}\n      [{layer} must not reach {edge.target}: {why}] e.g. {names}")
    return found


def test_layer_rules_name_real_modules():
    """A misspelt layer would make its rule hold vacuously."""
    modules = import_graph()
    named = {name for layer, forbidden, _ in LAYER_RULES for name in (layer, *forbidden)} | set(ENTRY_POINTS)
    assert {name for name in named if not any(_in(m, name) for m in modules)} <= {"specdec.__main__"}


def test_dependency_direction():
    violations = layer_violations(import_graph())
    assert not violations, f"{len(violations)} imports against ARCHITECTURE.md:\n" + "\n".join(violations)


def test_no_web_framework_below_cli_and_server():
    found = [f"{module_file(module)}:{line} imports {name}"
             for module in import_graph() if not _in(module, ENTRY_POINTS)
             for name, line in third_party_imports(module).items() if name in WEB_FRAMEWORKS]
    assert not found, found


def screen_writes(module: str) -> list[int]:
    """Lines calling ``print`` or touching ``sys.stdout`` / ``sys.stderr``."""
    lines = []
    for node in ast.walk(parsed(module)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "print":
            lines.append(node.lineno)
        elif (isinstance(node, ast.Attribute) and node.attr in ("stdout", "stderr")
              and isinstance(node.value, ast.Name) and node.value.id == "sys"):
            lines.append(node.lineno)
    return sorted(set(lines))


def test_nothing_below_cli_and_server_prints():
    found = [f"{module_file(module)}:{line}" for module in import_graph()
             if not _in(module, ENTRY_POINTS) and module not in ALLOWED_SCREEN_WRITES
             for line in screen_writes(module)]
    assert not found, f"prints or writes to sys.stdout/stderr below cli/server: {found}"
    for module in ALLOWED_SCREEN_WRITES:  # an allowance that is no longer needed goes
        assert screen_writes(module), f"{module} no longer writes to a screen: drop it from ALLOWED_SCREEN_WRITES"


def test_layer_rules_catch_a_violation():
    """The rule checker on the real graph with one forbidden import added (models -> engine)."""
    graph = dict(import_graph())
    graph["specdec.models.config"] += (Edge("specdec.models.config", "specdec.engine", 1),)
    added = [v for v in layer_violations(graph) if v not in layer_violations(import_graph())]
    assert "specdec.models.config -> specdec.engine (specdec/models/config.py:1)\n      [specdec.models must not reach " \
        "specdec.engine: models know no loop and no drafter] e.g. specdec.models.config -> specdec.engine" in added
    # the drafters reach the models through the backends: the same import breaks their rule too
    assert any("[specdec.drafters must not reach specdec.engine" in v for v in added)


def test_every_module_is_in_the_module_map():
    """docs/MODULES.md names every module of the package under its own package's heading (the shared
    ARCHITECTURE.md is the design; the map is where its pieces ended up, and it went stale before: a dozen
    modules added since were named nowhere but in their own files)."""
    import re

    text = (PACKAGE_DIR.parent / "docs" / "MODULES.md").read_text()
    listed = {(heading, name) for heading, body in re.findall(r"^## `([^`]+)/`\n(.*?)(?=^## |\Z)", text, re.S | re.M)
              for name in re.findall(r"^\| `([^`]+\.py)` \|", body, re.M)}
    present = set()
    for path in PACKAGE_DIR.rglob("*.py"):
        package = str(path.parent.relative_to(PACKAGE_DIR.parent))
        if path.name in ("__init__.py", "__main__.py") and package != "specdec" and not ast.get_docstring(ast.parse(path.read_text())):
            continue  # an empty package marker
        present.add((package, path.name))
    assert not present - listed, f"modules missing from docs/MODULES.md: {sorted(present - listed)}"
    assert not listed - present, f"docs/MODULES.md lists modules that do not exist: {sorted(listed - present)}"
