"""Imports flow cli -> runtime -> autotune -> kernels (runtime may call kernels directly), never back;
benchmarks use the library, never the CLI."""
import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# Each layer's directory and the vsr packages it may not import (the layers above it).
LAYERS = {"kernels": ("vsr.autotune", "vsr.runtime", "vsr.cli"), "autotune": ("vsr.runtime", "vsr.cli"),
          "runtime": ("vsr.cli",), "benchmarks": ("vsr.cli",)}


def imported_modules(path: Path) -> set[str]:
    """Every module a file imports, at any depth (function-level imports included); a relative
    import is named "relative:" plus its dots and module (the packages import absolutely)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level:
            out.add("relative:" + "." * node.level + (node.module or ""))
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names)
    return out


@pytest.mark.parametrize("layer", sorted(LAYERS))
def test_no_module_imports_a_layer_above_its_own(layer):
    files = sorted((ROOT / layer).rglob("*.py"))
    assert files
    # A relative import is refused outright: the layer it reaches depends on where the file lies.
    bad = [(str(f.relative_to(ROOT)), m) for f in files for m in sorted(imported_modules(f))
           if m.startswith("relative:") or any(m == up or m.startswith(up + ".") for up in LAYERS[layer])]
    assert not bad, f"{layer}/ imports from a layer above it: {bad}"
