"""bench/ shares its helpers through ``bench/_common.py`` (and ``_original.py``, ``reference.py``):
a benchmark never imports another benchmark, so there is no import circle among them (there was
one: latency -> profile_medium -> train_step -> latency). bench/ is a folder of scripts, not a
package, so import-linter does not see it; this reads each script's imports, at any depth."""

from __future__ import annotations

import ast
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "bench"
SHARED = {"reference"}  # beside the underscore modules: the reference-faithful model the benches compare with


def bench_imports() -> dict[str, set[str]]:
    names = {p.stem for p in BENCH.glob("*.py")}
    graph: dict[str, set[str]] = {}
    for path in sorted(BENCH.glob("*.py")):
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                found |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.add(node.module.split(".")[0])
        graph[path.stem] = (found & names) - {path.stem}
    return graph


def test_benchmarks_import_only_the_shared_modules() -> None:
    wrong = {m: sorted(d for d in deps if not (d.startswith("_") or d in SHARED))
             for m, deps in bench_imports().items()}
    assert not {m: d for m, d in wrong.items() if d}, f"a benchmark imports another (move the helper to bench/_common.py): {wrong}"


def test_no_import_circle_in_bench() -> None:
    graph = bench_imports()
    state: dict[str, int] = {}

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for d in sorted(graph.get(m, ())):
            assert state.get(d) != 1, "import circle in bench/: " + " -> ".join([*path, m, d])
            if d not in state:
                visit(d, [*path, m])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [])
