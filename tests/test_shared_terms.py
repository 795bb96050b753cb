"""Shared terms have one home (issue 29): each is defined by one module of the package, and no module lists explain's
methods again outside their registry. Read from the code with `ast`, as tests/test_architecture.py reads imports."""

from __future__ import annotations

import ast
from pathlib import Path

import vitcli
from vitcli.explain_methods import METHOD_NAMES

PACKAGE = Path(vitcli.__file__).parent

# Each shared term -> the one module that defines it.
HOMES = {
    "ExplainMethod": "vitcli/explain_methods.py",
    "EXPLAIN_METHODS": "vitcli/explain_methods.py",
    "PIXEL_METHODS": "vitcli/explain_methods.py",
    "CONTRAST_METHODS": "vitcli/explain_methods.py",
    "HOOKED_BACKWARD_METHODS": "vitcli/explain_methods.py",
    "ATTENTION_METHODS": "vitcli/explain_methods.py",
    "DEFAULT_METHODS": "vitcli/explain_methods.py",
    "resolve_class": "vitcli/target_class.py",
    "resolve_target": "vitcli/target_class.py",
    "resolve_target_text": "vitcli/target_class.py",
    "resolve_contrast": "vitcli/target_class.py",
    "target_or_top1": "vitcli/target_class.py",
    "check_weights_source": "vitcli/spec.py",
    "ClassProbability": "vitcli/experiments/results.py",
    "EmbeddingScore": "vitcli/experiments/results.py",
    "ClassScore": "vitcli/experiments/results.py",
    "top_classes": "vitcli/experiments/results.py",
}


def _modules() -> dict[str, ast.Module]:
    return {
        str(path.relative_to(PACKAGE.parent)): ast.parse(path.read_text(encoding="utf-8"))
        for path in sorted(PACKAGE.rglob("*.py"))
    }


def _defined(tree: ast.Module) -> dict[str, ast.stmt]:
    names = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names[node.name] = node
        elif isinstance(node, ast.Assign):
            names |= {target.id: node for target in node.targets if isinstance(target, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names[node.target.id] = node
    return names


def test_each_shared_term_is_defined_in_one_module():
    defined_in: dict[str, list[str]] = {name: [] for name in HOMES}
    for module, tree in _modules().items():
        for name in _defined(tree).keys() & HOMES.keys():
            defined_in[name].append(module)
    assert {name: modules for name, modules in defined_in.items() if modules != [HOMES[name]]} == {}


def test_no_module_lists_explain_s_methods_again():
    """A module-level tuple, list or set of two or more method names outside the registry is a second definition
    (GRADIENT_METHODS was once defined twice, with different members)."""
    methods = set(METHOD_NAMES)
    again = []
    for module, tree in _modules().items():
        if module == "vitcli/explain_methods.py":
            continue
        for name, node in _defined(tree).items():
            value = getattr(node, "value", None)
            if isinstance(value, ast.Call) and getattr(value.func, "id", None) in ("frozenset", "set", "tuple"):
                value = value.args[0] if value.args else None
            if isinstance(value, (ast.Tuple, ast.List, ast.Set)):
                listed = {item.value for item in value.elts if isinstance(item, ast.Constant)}
                if len(listed & methods) >= 2:
                    again.append(f"{module}: {name}")
    assert again == []
