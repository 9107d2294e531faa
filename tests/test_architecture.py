"""The package layout docs/architecture.md describes, measured on the tree (issue #12): no import
circles, a thin top level, no re-export-only modules, few deferred imports, small modules, and
imports that follow the data path."""

from __future__ import annotations

import ast
import re

import pytest

from scripts.architecture_figures import import_cycles, load_modules, top_level_modules

MODULES = load_modules()

# Each layer may import only the layers listed for it, besides itself and the leaves: modules
# of plain data that import nothing above them (errors, dtypes, DataFlow, the option values ...).
# Read top to bottom, this is the data path.
LEAVES = {"errors", "dtypes", "logging", "tensorinfo", "dataflow", "progress", "options",
          "files", "limits"}
ALLOWED = {
    "ir": set(),
    "ops": {"ir"},
    "importer": {"ir", "ops", "transforms"},
    "transforms": {"ir", "ops"},
    "optim": {"ir", "ops"},
    "device": {"ir", "ops", "transforms"},
    "report": {"ir", "device"},
}


def _layer(name: str) -> str | None:
    parts = name.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "popart_backend" else None


def test_no_import_circles():
    assert import_cycles(MODULES) == []


def test_thin_top_level():
    top = top_level_modules(MODULES, "popart_backend")
    assert len(top) <= 15, top


def test_no_module_only_reexports():
    assert [m.name for m in MODULES.values() if m.only_reexports] == []


def test_few_deferred_imports_each_with_a_reason():
    deferred = sorted({(m.name, line) for m in MODULES.values()
                       for line, _ in m.function_imports})
    assert len(deferred) <= 5, deferred
    for name, line in deferred:
        lines = MODULES[name].path.read_text().splitlines()
        assert "#" in lines[line - 1] or lines[line - 2].strip().startswith("#"), (
            f"{name}:{line}: an import inside a function needs a comment saying why")


def test_no_module_over_700_lines():
    big = [(m.name, m.num_lines) for m in MODULES.values() if m.num_lines > 700]
    assert big == []


@pytest.mark.parametrize("layer", sorted(ALLOWED))
def test_layer_imports_follow_the_data_path(layer):
    wrong = []
    for module in MODULES.values():
        if _layer(module.name) != layer:
            continue
        for target in module.imports | {t for _, t in module.function_imports}:
            other = _layer(target)
            if other in (None, layer) or other in LEAVES or other in ALLOWED[layer]:
                continue
            wrong.append(f"{module.name} -> {target}")
    assert wrong == []


def test_frontend_uses_only_the_public_backend_api():
    wrong = sorted(f"{m.name} -> {t}" for m in MODULES.values()
                   if m.name.startswith("poptorch_lite")
                   for t in m.imports | {t for _, t in m.function_imports}
                   if t.startswith("popart_backend") and t != "popart_backend")
    assert wrong == []


def _passes() -> list[tuple[str, ast.ClassDef, str]]:
    """(module, class, module docstring) of every pass: a class of transforms/ with ``run``."""
    found = []
    for module in MODULES.values():
        if not module.name.startswith("popart_backend.transforms."):
            continue
        tree = ast.parse(module.path.read_text())
        for node in tree.body:
            if isinstance(node, ast.ClassDef) and any(
                    isinstance(b, ast.FunctionDef) and b.name == "run" for b in node.body):
                found.append((module.name, node, ast.get_docstring(tree) or ""))
    return found


def test_every_pass_shows_a_tiny_ir_before_and_after():
    missing = [f"{name}.{node.name}" for name, node, module_doc in _passes()
               if "before" not in ((ast.get_docstring(node) or "") + module_doc).lower()]
    assert len(_passes()) > 20 and missing == []


def test_passes_and_device_read_no_undeclared_op_attributes():
    """Passes talk through the Ir: what they read off an op is a declared field, not a string
    looked up with getattr."""
    pattern = re.compile(r"\b(getattr|hasattr|setattr)\(\s*op\s*,")
    wrong = [f"{m.name}:{i}" for m in MODULES.values()
             if m.name.startswith(("popart_backend.transforms", "popart_backend.device",
                                   "popart_backend.session"))
             for i, line in enumerate(m.path.read_text().splitlines(), 1) if pattern.search(line)]
    assert wrong == []
