"""The folders are the architecture: docs/architecture.md lists the layers, top to bottom, and this test holds
the code to it. A module may import from its own layer's package and from layers below; every import counts
(module level, inside functions, under TYPE_CHECKING). No cycles, between packages or between modules."""
from __future__ import annotations

import ast
import re
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("metatable", "indexes", "avro_schemas")


def layers() -> list[tuple[str, list[str]]]:
    """(layer, its packages and modules), top first: the `layers` block of docs/architecture.md."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    block = re.search(r"```layers\n(.*?)```", text, re.S)
    assert block, "docs/architecture.md has no ```layers block"
    rows = [line.split() for line in block[1].splitlines() if line.strip()]
    return [(row[0], row[1:]) for row in rows]


def modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            found[name.removesuffix(".__init__")] = path
    return found


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The project modules `name` imports, anywhere in it."""
    def resolve(target: str) -> str | None:
        while target and target not in known:
            target = target.rpartition(".")[0]
        return target or None

    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out |= {resolve(a.name) for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
            out |= {resolve(f"{base}.{a.name}") if f"{base}.{a.name}" in known else resolve(base) for a in node.names}
    return {m for m in out if m and m != name}


def holds(entry: str, module: str) -> bool:
    """`pkg.*` holds a package and its modules; any other entry is one module."""
    return module == entry.removesuffix(".*") or (entry.endswith(".*") and module.startswith(entry[:-1]))


def owner(module: str, table: list[tuple[str, list[str]]]) -> tuple[int, str]:
    """(rank, entry) of the layer entry that holds `module`; rank 0 is the top layer."""
    found = [(rank, entry) for rank, (_, entries) in enumerate(table) for entry in entries if holds(entry, module)]
    assert len(found) == 1, f"{module} is in {len(found)} layers of docs/architecture.md, not one"
    return found[0]


def graph() -> tuple[dict[str, set[str]], list[tuple[str, list[str]]]]:
    known = modules()
    return {name: imports(name, path, known) for name, path in known.items()}, layers()


def upward(edges: dict[str, set[str]], table: list[tuple[str, list[str]]]) -> list[str]:
    """Imports of a module in a higher layer than the importer's (a layer may import itself: its cycles are
    the other test's)."""
    out = []
    for module, targets in edges.items():
        rank = owner(module, table)[0]
        out += [f"{module} ({table[rank][0]}) imports {target} ({table[owner(target, table)[0]][0]})"
                for target in targets if owner(target, table)[0] < rank]
    return sorted(out)


def unit_graph(edges: dict[str, set[str]], table: list[tuple[str, list[str]]]) -> dict[str, set[str]]:
    """The import graph between the layers' entries (packages, or modules at a package's root)."""
    units: dict[str, set[str]] = {}
    for module, targets in edges.items():
        unit = owner(module, table)[1]
        units.setdefault(unit, set()).update(owner(t, table)[1] for t in targets if owner(t, table)[1] != unit)
    return units


def cycle(g: dict[str, set[str]]) -> list[str] | None:
    try:
        tuple(TopologicalSorter(g).static_order())
    except CycleError as e:
        return e.args[1]
    return None


def test_every_module_has_a_layer_and_imports_only_downward():
    edges, table = graph()
    found = upward(edges, table)
    assert not found, "imports that point up:\n" + "\n".join(found)


def test_no_cycles_between_packages_or_modules():
    edges, table = graph()
    for name, g in (("packages", unit_graph(edges, table)), ("modules", edges)):
        found = cycle(g)
        assert found is None, f"an import cycle between {name}: {' -> '.join(found)}"


def test_every_subpackage_says_what_it_owns_and_what_it_may_import():
    for init in (ROOT / "metatable").glob("*/__init__.py"):
        doc = ast.get_docstring(ast.parse(init.read_text()))
        assert doc and "may import" in doc.lower(), f"{init.relative_to(ROOT)}: a docstring that says what it owns and " \
                                            "which packages it may import"


def test_the_checks_catch_an_upward_import_and_a_cycle():
    """The checks themselves, on a made-up graph: a pass above means something."""
    table = [("services", ["metatable.services.*"]), ("write", ["metatable.write.*"]), ("root", ["metatable.errors"])]
    edges = {"metatable.services.clean": {"metatable.write.engine", "metatable.errors"},
             "metatable.write.engine": {"metatable.services.clean"}, "metatable.errors": set()}
    assert upward(edges, table) == ["metatable.write.engine (write) imports metatable.services.clean (services)"]
    assert cycle(unit_graph(edges, table)) is not None
    del edges["metatable.write.engine"]
    assert upward(edges, table) == [] and cycle(unit_graph(edges, table)) is None
