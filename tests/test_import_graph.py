"""lptrain's modules import one another without a circle (function-level imports count too)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "lptrain"


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """Module -> the lptrain modules it imports anywhere in its text (a name imported from a
    package counts as its submodule when one of that name exists)."""
    modules = {module_name(p): p for p in ROOT.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        edges = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [
                    f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules else node.module
                    for a in node.names
                ]
            else:
                continue
            edges |= {t for t in targets if t in modules and t != name}
        graph[name] = edges
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_the_benchmarks_share_one_home_and_do_not_import_each_other():
    graph = import_graph()
    inprocess, distributed, table = "lptrain.bench.inprocess", "lptrain.bench.distributed", "lptrain.bench.table"
    assert distributed not in graph[inprocess] and inprocess not in graph[distributed]
    assert table in graph[inprocess] and table in graph[distributed]
    assert {inprocess, distributed} <= graph["lptrain.bench.cli"]  # the command chooses between them
    assert not any(m.startswith("lptrain.bench") for m in graph[table])  # the table needs neither


# The floors of docs/design.md: a module imports only from its own floor or below.
FLOORS = (
    (-1, ("lptrain.schema", "lptrain.errors", "lptrain.exits")),  # the ground floor: types, error, exit codes
    (0, ("lptrain.comm", "lptrain.data", "lptrain.models")),  # the collectives; data; networks
    (1, ("lptrain.sim",)),  # pricing schedules
    (2, ("lptrain.auto",)),  # choosing: stands above measuring
    (3, ("lptrain.communicators",)),  # the one factory
    (4, ("lptrain.train", "lptrain.ddp")),  # the trainer; DDP's hook and backend
    (5, ("lptrain.bench", "lptrain.cluster")),  # lptrain-bench, lptrain-cluster
    (6, ("lptrain", "lptrain.cli", "lptrain.settings", "lptrain.report")),  # command lines, checks
)


def within(name: str, package: str) -> bool:
    """``name`` is ``package`` or a module under it."""
    return name == package or name.startswith(f"{package}.")


def floor_of(module: str) -> int:
    """The floor of the most specific package ``module`` is in."""
    matches = [(len(package), floor) for floor, packages in FLOORS for package in packages if within(module, package)]
    assert matches, f"{module} is on no floor: add it to FLOORS (and to docs/design.md)"
    return max(matches)[1]


def test_every_module_imports_only_its_floor_and_below():
    """An arrow up a floor makes the lower part need the upper one to import at all (comm
    would need the simulator, the trainer the command line)."""
    assert floor_of("lptrain.comm.auto_like") == 0 and floor_of("lptrain.auto.tuning") == 2
    graph = import_graph()
    upward = sorted(
        f"{module} (floor {floor_of(module)}) -> {target} (floor {floor_of(target)})"
        for module, targets in graph.items()
        for target in targets
        if floor_of(target) > floor_of(module)
    )
    assert not upward, "imports up a floor:\n" + "\n".join(upward)


def test_auto_chooses_with_the_collectives_and_the_simulator_and_the_factory_builds_it():
    graph = import_graph()
    auto = set().union(*(targets for module, targets in graph.items() if within(module, "lptrain.auto")))
    assert any(within(t, "lptrain.comm") for t in auto) and any(within(t, "lptrain.sim") for t in auto)
    assert "lptrain.auto" in graph["lptrain.communicators"]  # the one factory builds auto too


def test_the_import_graph_has_no_circle():
    graph = import_graph()
    assert find_cycle({"a": {"b"}, "b": {"a"}}) == ["a", "b", "a"]  # the finder finds one
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph))
