"""The package's import graph, read from the code with `ast`: no import circles, no new import of the CLI by the rest.

An arrow A -> B is any `import`/`from ... import` in module A that names module B and runs when A runs: at module
level or inside a function (a function-level import still ties A to B; it only delays the cost). Imports under
`if TYPE_CHECKING:` are not arrows: they never run, and they are how annotations name a type from a higher module.
`from package import name` is an arrow to `package.name` when that is a module, else to the package. Importing
`a.b` also runs `a/__init__.py` first; those arrows to a module's own enclosing packages are left out, implicit or
written (`from vitcli import __version__` in vitcli.shell reads a name of a package that already ran). The modules
`vitcli.job_registry` imports by name from its table (JOB_MODULES) are arrows too: a lazy import is still an import.

docs/architecture.md describes the layers this test enforces.
"""

from __future__ import annotations

import ast
import subprocess
import sys
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
        if name in MODULE_TABLES:
            targets.update(table_modules(path, MODULE_TABLES[name]))
        graph[name] = {
            target for target in targets if target in modules and target != name and not name.startswith(target + ".")
        }
    return graph


# Modules that import modules by name from a table (module -> the table's name): each name is an arrow.
MODULE_TABLES = {"vitcli.job_registry": "JOB_MODULES"}


def table_modules(path: Path, table: str) -> set[str]:
    """The module paths in a table of module names (JOB_MODULES), as `ast` reads the literal."""
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == table for t in node.targets):
            return set(ast.literal_eval(node.value).values())
    raise AssertionError(f"{path} has no {table} table")


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
    """`vitcli run` configs and the Python API convert an option through a click parameter built from the builder's
    own declaration (vitcli.declared_options), not through the command line's app."""
    found = back_edges(import_graph())
    assert not found, "the library imports the CLI layer (" + ", ".join(CLI_LAYER) + "):\n" + "\n".join(found)


def test_the_job_registry_lists_what_the_cli_registers():
    """The table the API and `vitcli run` use names, for each command, the module that registers its builder."""
    import vitcli.cli  # noqa: F401  (imports every command, registering its builder)
    from vitcli.job_registry import JOB_MODULES
    from vitcli.jobs import JOB_BUILDERS

    assert sorted(JOB_MODULES) == sorted(JOB_BUILDERS)
    assert {command: JOB_BUILDERS[command].__module__ for command in JOB_MODULES} == JOB_MODULES


def _described(parameter) -> dict:
    """What makes a click parameter convert and refuse a value: its names, type, default, range and kind."""
    descriptor = parameter.type_descriptor
    return {
        "opts": parameter.opts + parameter.secondary_opts,
        "type": repr(descriptor.annotation),
        "choices": repr(descriptor.choices),
        "default": repr(parameter.default),
        "multiple": parameter.multiple,
        "flag": parameter.is_flag,
        "range": (getattr(parameter, "min", None), getattr(parameter, "max", None)),
    }


def test_configs_convert_each_option_as_the_command_line_does():
    """For every command, the options a `vitcli run` config (and the API) converts are the command line's own: the
    same names, types, choices, defaults and ranges; the shared options too. Both are built from one declaration per
    option, so they cannot drift apart."""
    import typer.main

    import vitcli.cli  # noqa: F401  (puts every command on the app)
    from vitcli.batch.config import _click_parameters, _parameters_declared
    from vitcli.job_registry import JOB_MODULES
    from vitcli.shared_options import SHARED_NAMES, shared_parameters
    from vitcli.shell import app

    commands = typer.main.get_command(app).commands  # type: ignore[attr-defined]
    for command in JOB_MODULES:
        on_the_command_line = {
            parameter.name: _described(parameter)
            for parameter in commands[command].params
            if parameter.param_type_name == "option"
        }
        in_a_config = {name: _described(parameter) for name, parameter in _click_parameters(command).items()}
        assert in_a_config == on_the_command_line, command
        assert list(in_a_config) == list(on_the_command_line), command  # --help's order is the builder's
        assert set(SHARED_NAMES) < set(in_a_config), command
    run_options = {parameter.name: parameter for parameter in commands["run"].params}
    shared = _parameters_declared(shared_parameters())  # what a config's [model] and [output] convert through
    assert list(shared) == SHARED_NAMES
    assert {name: _described(parameter) for name, parameter in shared.items()} == {
        name: _described(run_options[name]) for name in SHARED_NAMES
    }


def test_the_api_finds_a_builder_without_importing_the_cli():
    """No import side effect: a fresh process runs an experiment through the API without ever importing vitcli.cli."""
    code = (
        "import sys, vitcli; from vitcli.job_registry import job_builder; "
        "from vitcli.api import _command_line_parameters; "
        "jobs = job_builder('attend')(block=1, head=2, query='cls'); _command_line_parameters('attend'); "
        "print(type(jobs[0]).__name__, 'vitcli.cli' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[-1] == "False"


def test_the_cycle_finder_finds_cycles():
    """The oracle for the checks above: a hand-made graph with one circle and one chain."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert cycles(graph) == [["a", "b", "c"]]
    assert back_edges({"vitcli.api": {"vitcli.cli", "vitcli.errors"}, "vitcli.cli": {"vitcli.api"}}) == [
        "vitcli.api -> vitcli.cli"
    ]
