"""The package's layers, as README "Layout" writes them down, held against the code's own imports.

Nodes are egrm's first-level parts (packages and top-level modules); an edge is any import of one
part by another, lazy imports inside functions included. A part may import only from layers below
its own: no cycle, and nothing upward.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "egrm"

# Bottom first; README "Layout" shows the same table.
LAYERS = [
    {"protocol", "aio", "chat_text", "gpu_monitor", "judge"},
    {"config", "client", "protocol_openai", "protocol_openrlhf"},
    {"engines"},
    {"pipeline"},
    {"scorer", "metrics"},
    {"factory", "api"},
    {"main", "worker", "evals", "integrations", "llamacpp_local"},
    {"training", "batch", "startup"},
    {"cli"},
    {"entry"},
]
LAYER = {part: level for level, parts in enumerate(LAYERS) for part in parts}


def part_of(module: str) -> str | None:
    names = module.split(".")
    return names[1] if names[0] == "egrm" and len(names) > 1 else None


def imports() -> dict[tuple[str, str], set[str]]:
    """(importer, imported) -> the files that make the edge."""
    edges: dict[tuple[str, str], set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        relative = path.relative_to(PACKAGE.parent).with_suffix("")
        source = part_of(".".join(relative.parts))
        if source in (None, "__init__"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            modules = []
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                modules = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
            for module in modules:
                target = part_of(module)
                if target and target != source:
                    edges.setdefault((source, target), set()).add(str(path.relative_to(PACKAGE.parent)))
    return edges


def test_every_part_has_a_layer():
    parts = {p.stem if p.suffix == ".py" else p.name for p in PACKAGE.iterdir() if p.suffix == ".py" or p.is_dir()}
    parts -= {"__init__", "__pycache__"}
    assert parts == set(LAYER), (
        f"parts without a layer: {sorted(parts - set(LAYER))}; gone: {sorted(set(LAYER) - parts)}"
    )


def test_imports_only_go_down_so_there_is_no_cycle():
    upward = [
        f"{a} (layer {LAYER[a]}) imports {b} (layer {LAYER[b]}): {', '.join(sorted(files))}"
        for (a, b), files in imports().items()
        if LAYER[b] >= LAYER[a]
    ]
    assert not upward, "\n".join(upward)


def test_the_check_sees_an_upward_import(tmp_path, monkeypatch):
    """The test can fail: a module of a low layer importing a higher one is reported."""
    fake = tmp_path / "egrm"
    (fake / "engines").mkdir(parents=True)
    (fake / "engines" / "x.py").write_text("def f():\n    from egrm.main import create_app\n")
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", fake)
    assert imports() == {("engines", "main"): {"egrm/engines/x.py"}}
