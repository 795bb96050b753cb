"""The package's import graph, read from the code with `ast`: no import circles, and the library never imports the CLI.

An arrow A -> B is any `import`/`from ... import` in module A that names module B and runs when A runs: at module
level or inside a function (a function-level import still ties A to B; it only delays the cost). Imports under
`if TYPE_CHECKING:` are not arrows: they never run, and they are how annotations name a type from a higher module.
`from package import name` is an arrow to `package.name` when that is a module, else to the package. Importing
`a.b` also runs `a/__init__.py`; those implicit arrows to parent packages are left out (vitcli's own `__init__`
only imports the API lazily, on attribute access).

docs/architecture.md describes the layers this test enforces.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "vitcli"

# The command-line layer: Typer glue and the shared option declarations. Everything else is the library, which the
# CLI, `vitcli run` configs and the Python API (vitcli.api) all stand on.
CLI_LAYER = ("vitcli.cli", "vitcli.__main__", "vitcli.shell", "vitcli.options", "vitcli.commands")


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def runtime_imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement that can run: anywhere in the module except the body of `if TYPE_CHECKING:`."""
    found: list[ast.Import | ast.ImportFrom] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and is_type_checking(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def import_graph() -> dict[str, set[str]]:
    """Module -> the vitcli modules it imports at run time."""
    paths = sorted(PACKAGE.rglob("*.py"))
    modules = {module_name(path): path for path in paths}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        targets: set[str] = set()
        for node in runtime_imports(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
                continue
            base = node.module or ""
            if node.level:
                anchor = name.split(".") if is_package else name.split(".")[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                targets.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base)
        graph[name] = {target for target in targets if target in modules and target != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan's algorithm), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node]):
            if target not in index:
                connect(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
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

    for node in sorted(graph):
        if node not in index:
            connect(node)
    return sorted(found)


def in_cli_layer(module: str) -> bool:
    return any(module == layer or module.startswith(layer + ".") for layer in CLI_LAYER)


def back_edges(graph: dict[str, set[str]]) -> list[str]:
    """Arrows from the library up into the CLI layer."""
    return [
        f"{source} -> {target}"
        for source in sorted(graph)
        if not in_cli_layer(source)
        for target in sorted(graph[source])
        if in_cli_layer(target)
    ]


def test_the_graph_is_read_from_the_code():
    """The reader finds arrows the package surely has, function-level ones included, and no TYPE_CHECKING ones."""
    graph = import_graph()
    assert "vitcli.errors" in graph["vitcli.shell"]  # module level
    assert "vitcli.api" in graph["vitcli"]  # inside a function (the lazy `vitcli.<function>`)
    assert "vitcli.capture.sites" in graph["vitcli.capture"]  # re-exported by a package
    assert "vitcli.model" not in graph["vitcli.jobs"]  # only under TYPE_CHECKING
    assert graph.keys() >= {"vitcli.cli", "vitcli.commands.ablate", "vitcli.batch.record"}


def test_no_import_cycles():
    found = cycles(import_graph())
    assert not found, "import cycles (each a set of modules that import each other):\n" + "\n".join(
        " <-> ".join(component) for component in found
    )


def test_the_library_does_not_import_the_cli():
    found = back_edges(import_graph())
    assert not found, "the library imports the CLI layer (" + ", ".join(CLI_LAYER) + "):\n" + "\n".join(found)


def test_the_cycle_finder_finds_cycles():
    """The oracle for the checks above: a hand-made graph with one circle and one chain."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert cycles(graph) == [["a", "b", "c"]]
    assert back_edges({"vitcli.api": {"vitcli.cli", "vitcli.errors"}, "vitcli.cli": {"vitcli.api"}}) == [
        "vitcli.api -> vitcli.cli"
    ]
