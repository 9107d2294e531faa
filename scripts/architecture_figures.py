"""Measure the package layout: import circles, imports inside functions, re-export-only modules,
top-level module count and module sizes of popart_backend and poptorch_lite.

Run `python scripts/architecture_figures.py` for the figures; tests/test_architecture.py holds
the limits docs/architecture.md states.
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("popart_backend", "poptorch_lite")


@dataclass
class Module:
    name: str
    path: Path
    is_package: bool
    num_lines: int
    imports: set[str] = field(default_factory=set)  # module-level in-project imports
    type_checking_imports: set[str] = field(default_factory=set)
    function_imports: list[tuple[int, str]] = field(default_factory=list)  # (line, target)
    only_reexports: bool = False


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _resolve(module: Module, node: ast.ImportFrom | ast.Import, known: set[str]) -> list[str]:
    """The in-project modules an import statement loads (a `from pkg import sub` names the
    submodule when `sub` is one)."""
    targets: list[str] = []
    if isinstance(node, ast.Import):
        for alias in node.names:
            if alias.name.split(".")[0] in PACKAGES:
                targets.append(alias.name)
        return targets
    if node.level:
        base = module.name.split(".")
        if not module.is_package:
            base = base[:-1]
        base = base[: len(base) - (node.level - 1)]
        prefix = ".".join(base + ([node.module] if node.module else []))
    else:
        prefix = node.module or ""
    if prefix.split(".")[0] not in PACKAGES:
        return []
    for alias in node.names:
        sub = f"{prefix}.{alias.name}"
        targets.append(sub if sub in known else prefix)
    return targets


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _only_reexports(tree: ast.Module, is_package: bool) -> bool:
    """A module whose body is nothing but imports (plus a docstring and `__all__`)."""
    if is_package:
        return False
    body = [
        n
        for n in tree.body
        if not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant))
        and not (
            isinstance(n, (ast.Assign, ast.AnnAssign))
            and any(isinstance(t, ast.Name) and t.id == "__all__" for t in _targets(n))
        )
    ]
    if not body:
        return False
    return all(isinstance(n, (ast.Import, ast.ImportFrom)) for n in body)


def _targets(node: ast.Assign | ast.AnnAssign) -> list[ast.expr]:
    return node.targets if isinstance(node, ast.Assign) else [node.target]


def load_modules() -> dict[str, Module]:
    modules: dict[str, Module] = {}
    trees: dict[str, ast.Module] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            name = _module_name(path)
            text = path.read_text()
            modules[name] = Module(
                name, path, path.name == "__init__.py", len(text.splitlines())
            )
            trees[name] = ast.parse(text)
    known = set(modules)
    for name, tree in trees.items():
        module = modules[name]
        module.only_reexports = _only_reexports(tree, module.is_package)
        _collect(module, tree.body, known, in_function=False, type_checking=False)
    return modules


def _collect(module: Module, body: list[ast.stmt], known: set[str], *, in_function: bool,
             type_checking: bool) -> None:
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            for target in _resolve(module, node, known):
                if target == module.name:
                    continue
                if in_function:
                    if (node.lineno, target) not in module.function_imports:
                        module.function_imports.append((node.lineno, target))
                elif type_checking:
                    module.type_checking_imports.add(target)
                else:
                    module.imports.add(target)
            continue
        if isinstance(node, ast.If) and _is_type_checking(node):
            _collect(module, node.body, known, in_function=in_function, type_checking=True)
            _collect(module, node.orelse, known, in_function=in_function,
                     type_checking=type_checking)
            continue
        inner = isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        for child_body in _child_bodies(node):
            _collect(module, child_body, known, in_function=in_function or inner,
                     type_checking=type_checking)


def _child_bodies(node: ast.stmt) -> list[list[ast.stmt]]:
    bodies = []
    for attr in ("body", "orelse", "finalbody"):
        value = getattr(node, attr, None)
        if isinstance(value, list) and value and isinstance(value[0], ast.stmt):
            bodies.append(value)
    for handler in getattr(node, "handlers", []) or []:
        bodies.append(handler.body)
    for case in getattr(node, "cases", []) or []:
        bodies.append(case.body)
    return bodies


def edges(module: Module) -> set[str]:
    """Every import of a module, deferred ones (inside functions) and `if TYPE_CHECKING:` ones
    included: a circle hidden in a function body is still a circle. TYPE_CHECKING imports
    between modules of `ir/` are the one exception (Graph, Op and Tensor name each other in
    annotations)."""
    targets = set(module.imports) | {t for _, t in module.function_imports}
    in_ir = module.name.startswith("popart_backend.ir")
    targets |= {t for t in module.type_checking_imports
                if not (in_ir and t.startswith("popart_backend.ir"))}
    return targets


def import_cycles(modules: dict[str, Module]) -> list[list[str]]:
    """Strongly connected components (size > 1) of the import graph (see `edges`)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    counter = [0]

    sys.setrecursionlimit(10000)

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in edges(modules[v]):
            if w not in modules:
                continue
            if w not in index:
                visit(w)
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
            if len(component) > 1:
                cycles.append(sorted(component))

    for name in sorted(modules):
        if name not in index:
            visit(name)
    return cycles


def top_level_modules(modules: dict[str, Module], package: str) -> list[str]:
    return sorted(
        m.name for m in modules.values()
        if not m.is_package and m.name.count(".") == 1 and m.name.startswith(package + ".")
    )


def main() -> int:
    modules = load_modules()
    cycles = import_cycles(modules)
    print(f"import circles: {len(cycles)}")
    for cycle in cycles:
        print("   ", " <-> ".join(cycle))
    function_imports = sorted({(m.name, line, t) for m in modules.values()
                               for line, t in m.function_imports})
    print(f"in-project imports inside functions: {len(function_imports)}")
    for name, line, target in sorted(function_imports):
        print(f"    {name}:{line} -> {target}")
    for package in PACKAGES:
        top = top_level_modules(modules, package)
        print(f"top-level modules in {package}: {len(top)}")
    reexports = sorted(m.name for m in modules.values() if m.only_reexports)
    print(f"modules that only re-export: {len(reexports)} {reexports}")
    biggest = sorted(modules.values(), key=lambda m: -m.num_lines)[:5]
    print("largest modules:", ", ".join(f"{m.name} {m.num_lines}" for m in biggest))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
