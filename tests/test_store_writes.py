"""Only the output store writes files (vitcli.store: atomically, a result's files all together or none), read from
the code with `ast`, as tests/test_architecture.py reads the imports.

A write is a call that creates, changes or removes a file or folder: Path's write_text, write_bytes, mkdir, touch,
unlink, rmdir, rename; os's and shutil's file operations and tempfile; `open` (builtin, io, Path, os) with a mode or
flags that write; and a serializer (savefig, np.save, PIL's and torch's save, to_csv, json.dump ...) whose value is
dropped, given a destination that is not a stream. A serializer whose value is kept returns the bytes or text
(safetensors' `save`, `to_csv()`). A stream is a name the function was handed (the store hands every figure and file
writer the stream it opened) or a name it bound to an in-memory io.BytesIO or io.StringIO. Everything else is a
write, allowed only in WRITERS.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "vitcli"

# The modules that may write, each with why. The test fails when one of them stops writing: the list only shrinks.
WRITERS = {
    "vitcli/store.py": "the output store",
    "vitcli/capture/family_table.py": "a developer tool: `make docs` rewrites the family table of docs/models.md",
    "vitcli/shapes_training.py": "a developer tool: `make shapes-model` writes the shipped model and its record",
}

PATH_WRITES = {"write_text", "write_bytes", "mkdir", "touch", "unlink", "rmdir", "symlink_to", "hardlink_to", "chmod"}
MODULE_WRITES = {
    "os": {
        "remove",
        "unlink",
        "rename",
        "replace",
        "mkdir",
        "makedirs",
        "rmdir",
        "removedirs",
        "symlink",
        "link",
        "truncate",
        "chmod",
        "mkfifo",
    },
    "shutil": {"copy", "copy2", "copyfile", "copytree", "move", "rmtree", "make_archive", "unpack_archive"},
    "tempfile": {"mkstemp", "mkdtemp", "NamedTemporaryFile", "TemporaryDirectory", "TemporaryFile"},
}
# Serializer -> the index of its destination among the positional arguments.
SERIALIZERS = {
    "savefig": 0,
    "save": 0,
    "savez": 0,
    "savez_compressed": 0,
    "savetxt": 0,
    "save_file": 1,
    "to_csv": 0,
    "to_json": 0,
    "to_parquet": 0,
    "to_pickle": 0,
    "to_excel": 0,
    "tofile": 0,
    "dump": 1,
}
WRITE_FLAGS = {"O_WRONLY", "O_RDWR", "O_CREAT", "O_APPEND", "O_TRUNC"}


class Writes(ast.NodeVisitor):
    """Each write call of one module as `line: source`, by the rules of the module docstring."""

    def __init__(self, source: str):
        self.source = source
        self.streams: list[set[str]] = [set()]  # per enclosing function: its parameters and in-memory buffers
        self.found: list[str] = []
        self.statements: set[int] = set()  # calls whose value is dropped (a serializer that writes returns nothing)

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) -> None:
        arguments = node.args
        names = {argument.arg for argument in [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]}
        for body_node in ast.walk(node):
            if isinstance(body_node, ast.Assign) and _called(body_node.value) in ("BytesIO", "StringIO"):
                names.update(target.id for target in body_node.targets if isinstance(target, ast.Name))
        self.streams.append(names)
        self.generic_visit(node)
        self.streams.pop()

    visit_AsyncFunctionDef = visit_FunctionDef
    visit_Lambda = visit_FunctionDef

    def visit_Expr(self, node: ast.Expr) -> None:
        self.statements.add(id(node.value))
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        if self.writes(node):
            self.found.append(f"{node.lineno}: {ast.get_source_segment(self.source, node)}")
        self.generic_visit(node)

    def writes(self, call: ast.Call) -> bool:
        function = call.func
        name = _called(call)
        owner = (
            function.value.id if isinstance(function, ast.Attribute) and isinstance(function.value, ast.Name) else None
        )
        if owner == "os" and name == "open":
            opens_devnull = bool(call.args) and ast.unparse(call.args[0]) == "os.devnull"
            flags = {node.attr for node in ast.walk(call) if isinstance(node, ast.Attribute)}
            return bool(flags & WRITE_FLAGS) and not opens_devnull
        if owner in MODULE_WRITES:
            return name in MODULE_WRITES[owner]
        if isinstance(function, ast.Attribute) and name in PATH_WRITES:
            return True
        if isinstance(function, ast.Attribute) and name == "rename":
            return bool(call.args)  # Path.rename(target); a frame's rename takes keywords
        if name == "open":
            position = 1 if isinstance(function, ast.Name) or owner == "io" else 0
            mode = _argument(call, position, "mode")
            if isinstance(mode, ast.Constant) and isinstance(mode.value, str):
                return any(letter in mode.value for letter in "wax+")
            return mode is not None and isinstance(function, ast.Name)  # builtin open with a computed mode
        if name in SERIALIZERS and id(call) in self.statements:
            destination = _argument(call, SERIALIZERS[name], "path_or_buf")
            if destination is None:
                return False
            return not (isinstance(destination, ast.Name) and any(destination.id in names for names in self.streams))
        return False


def _called(node: ast.AST) -> str | None:
    if not isinstance(node, ast.Call):
        return None
    function = node.func
    return function.attr if isinstance(function, ast.Attribute) else getattr(function, "id", None)


def _argument(call: ast.Call, position: int, keyword: str) -> ast.expr | None:
    for given in call.keywords:
        if given.arg == keyword:
            return given.value
    return call.args[position] if len(call.args) > position else None


def writes_in(source: str) -> list[str]:
    visitor = Writes(source)
    visitor.visit(ast.parse(source))
    return visitor.found


def package_writes() -> dict[str, list[str]]:
    """Module path (relative to the repository) -> its writes, for every module that has any."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        writes = writes_in(path.read_text(encoding="utf-8"))
        if writes:
            found[str(path.relative_to(PACKAGE.parent))] = writes
    return found


def test_only_the_store_writes_files():
    found = package_writes()
    outside = {module: writes for module, writes in found.items() if module not in WRITERS}
    assert not outside, (
        "files written outside vitcli/store.py (give them to the store: OutputStore.write):\n"
        + "\n".join(f"{module}:{write}" for module, writes in outside.items() for write in writes)
    )
    assert set(WRITERS) <= set(found), f"no longer writing, drop from WRITERS: {sorted(set(WRITERS) - set(found))}"


@pytest.mark.parametrize(
    "source",
    [
        "Path('a').write_text('x')",
        "folder.mkdir(parents=True)",
        "path.unlink()",
        "os.replace(a, b)",
        "shutil.copy(a, b)",
        "tempfile.mkstemp()",
        "open(path, 'w')",
        "open(path, mode='ab')",
        "path.open('w')",
        "os.open(path, os.O_WRONLY | os.O_CREAT)",
        "figure.savefig('figure.png')",
        "def f(figure, path):\n    figure.savefig(path.with_suffix('.png'))",
        "np.save('a.npy', array)",
        "frame.to_csv('a.csv')",
        "json.dump(value, open(path))",
        "def f(value):\n    stream = make_stream()\n    json.dump(value, stream)",
    ],
)
def test_the_scan_sees_a_write(source):
    assert writes_in(source), source


@pytest.mark.parametrize(
    "source",
    [
        "def write(stream):\n    figure.savefig(stream, format='png')",
        "buffer = None\ndef f(array):\n    buffer = io.BytesIO()\n    np.save(buffer, array)",
        "text = frame.to_csv(index=False)",
        "data = save({'weights': tensor}, metadata=metadata)",
        "open(path)",
        "open(path, 'rb')",
        "path.open(encoding='utf-8')",
        "Image.open(path)",
        "os.open(os.devnull, os.O_WRONLY)",
        "names.remove('a')",
        "frame.rename(columns={'a': 'b'})",
        "text.replace('a', 'b')",
    ],
)
def test_the_scan_passes_what_writes_no_file(source):
    assert not writes_in(source), source
