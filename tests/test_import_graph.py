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


LOWER = ("lptrain.comm", "lptrain.sim", "lptrain.train", "lptrain.data", "lptrain.ddp")
UPPER = ("lptrain.bench", "lptrain.settings")


def within(name: str, package: str) -> bool:
    """``name`` is ``package``, a module under it, or a top-level sibling of it such as ``lptrain.bench_common``."""
    return name == package or name.startswith((f"{package}.", f"{package}_"))


def test_no_lower_layer_reaches_up_into_the_benchmark_or_the_settings():
    """comm, sim, train, data and ddp are what the benchmark and the settings are built on:
    an arrow back up would make the lower layer need the upper one to import at all."""
    graph = import_graph()
    assert within("lptrain.bench.table", "lptrain.bench") and not within("lptrain.benchmarks", "lptrain.bench")
    upward = sorted(
        f"{module} -> {target}"
        for module, targets in graph.items()
        if any(within(module, low) for low in LOWER)
        for target in targets
        if any(within(target, high) for high in UPPER)
    )
    assert not upward, "imports up into bench or settings:\n" + "\n".join(upward)


def test_the_import_graph_has_no_circle():
    graph = import_graph()
    assert find_cycle({"a": {"b"}, "b": {"a"}}) == ["a", "b", "a"]  # the finder finds one
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph))


# Choosing stands above measuring: (floor, what it must not import, function-level imports included).
FLOORS = {
    "lptrain.comm": ("lptrain.sim", "lptrain.auto", "lptrain.communicators"),
    "lptrain.sim": ("lptrain.auto", "lptrain.communicators"),
    "lptrain.auto": ("lptrain.communicators", "lptrain.train", "lptrain.bench", "lptrain.settings"),
}


def test_the_collectives_the_simulator_and_auto_each_import_only_what_stands_below_them():
    """comm knows neither the simulator nor auto nor the factory that builds auto; the
    simulator does not know auto; auto uses comm and sim and nothing above the factory."""
    graph = import_graph()
    upward = sorted(
        f"{module} -> {target}"
        for floor, above in FLOORS.items()
        for module, targets in graph.items()
        if within(module, floor)
        for target in targets
        if any(within(target, high) for high in above)
    )
    assert not upward, "imports up a floor:\n" + "\n".join(upward)
    auto = set().union(*(targets for module, targets in graph.items() if within(module, "lptrain.auto")))
    assert any(within(t, "lptrain.comm") for t in auto) and any(within(t, "lptrain.sim") for t in auto)
    assert "lptrain.auto" in graph["lptrain.communicators"]  # the one factory builds auto too
