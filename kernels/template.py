"""The interface every format template offers to the autotuner and the runtime.

A template is one Triton kernel family for one weight format. The autotuner knows
kernels only through this: a name, a hash of the template's source, a search
space and a default tile per row bucket, a launcher and the pure-torch reference
that defines the format's numerics.
"""
from __future__ import annotations

import ast
import functools
import hashlib
import inspect
import io
import tokenize
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Callable

import torch

# A tile is a flat dict of ints (and the odd short string, such as the path
# "gemv" | "splitk" | "tiled"): JSON-serialisable, hashable once sorted.
Tile = dict[str, Any]


def path_group(tile) -> Any:
    """The tuner's pick group of a tile whose template names no other (Template.pick_group): its
    path (None for what is no tile)."""
    return tile.get("path") if isinstance(tile, dict) else None


def glu_on_every_tile(tile) -> bool:
    """Template.glu_in_epilogue of a template whose every tile takes SwiGLU in its epilogue."""
    return True


@dataclass(frozen=True)
class Problem:
    """What a tile is chosen for: one linear layer's shape and format, one row bucket."""

    N: int
    K: int
    bucket: int
    act_dtype: torch.dtype
    params: tuple[tuple[str, Any], ...] = ()  # format parameters (bits, group, symmetric, ...)

    def param(self, name: str, default: Any = None) -> Any:
        return dict(self.params).get(name, default)


@dataclass(frozen=True)
class Template:
    name: str
    module: ModuleType
    # search_space(problem) -> candidate tiles for this bucket, default tile first.
    search_space: Callable[[Problem], list[Tile]]
    # default_tile(problem) -> the deterministic tile used on a cache miss with policy "default".
    default_tile: Callable[[Problem], Tile]
    # launch(x, weight, tile) -> y ; x is [M, K], y is [M, N] in x's dtype.
    launch: Callable[..., torch.Tensor]
    # reference(x, weight) -> y ; the exact numerics, pure torch.
    reference: Callable[..., torch.Tensor]
    # problem(weight, M, act_dtype) -> the Problem a call of this template solves.
    problem: Callable[..., Problem] = field(default=None)  # type: ignore[assignment]
    # pick_group(tile) -> the group of the tuner's candidate pick a tile belongs to (autotune.tuner
    # .candidates shares the pick out among groups): its path unless the template says otherwise,
    # e.g. a kernel form that few tiles of the path stand for.
    pick_group: Callable[[Tile], Any] = path_group
    # glu_in_epilogue(tile) -> whether the runtime has this tile apply SwiGLU in its epilogue
    # (launch's glu) to a product over interleaved gate|up rows; where not, it runs the plain
    # product and then the activation kernel over the interleaved columns (the same bytes).
    glu_in_epilogue: Callable[[Tile], bool] = glu_on_every_tile

    @property
    def modules(self) -> tuple[ModuleType, ...]:
        """The modules source_hash covers: the template's own (a subclass may add those its
        kernels call into)."""
        return (self.module,)

    @property
    def source_hash(self) -> str:
        """source_hash of `modules`, in order: a changed kernel never reuses old tiles."""
        return source_hash(*self.modules)


def code_text(module: ModuleType) -> str:
    """A module's source without its comments, docstrings and blank lines: what the source hashes
    cover, so that a note in a kernel file leaves the cache keys (and a shipped cache) valid,
    while any change to code changes them. Line-based, on positions that Python's tokenizer and
    parser give alike from 3.11 on, so the text is the same on every supported Python."""
    src = inspect.getsource(module)
    lines = src.splitlines()
    drop: set[int] = set()
    for node in ast.walk(ast.parse(src)):
        body = getattr(node, "body", None)
        if not isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) or not body:
            continue
        doc = body[0]
        if isinstance(doc, ast.Expr) and isinstance(doc.value, ast.Constant) and isinstance(doc.value.value, str):
            first, last = lines[doc.lineno - 1], lines[doc.end_lineno - 1]
            # Only a docstring alone on its lines (not `def f(): "doc"`) is dropped.
            if first[:doc.col_offset].strip() == "" and last[doc.end_col_offset:].strip() == "":
                drop.update(range(doc.lineno, doc.end_lineno + 1))
    comment_at = {t.start[0]: t.start[1] for t in tokenize.generate_tokens(io.StringIO(src).readline)
                  if t.type == tokenize.COMMENT}
    out = []
    for i, line in enumerate(lines, 1):
        if i in drop:
            continue
        line = line[:comment_at[i]].rstrip() if i in comment_at else line.rstrip()
        if line:
            out.append(line)
    return "\n".join(out) + "\n"


@functools.lru_cache(maxsize=None)
def module_code_text(module: ModuleType) -> str:
    """code_text of a loaded module, once per process: kernels/common.py is a dependency of
    every template, and its text (ast + tokenize) costs."""
    return code_text(module)


# Modules that only choose tiles: the candidates a tuner tries and the default tile a cache miss
# runs. What a recorded tile computes does not depend on them (the launchers and kernels never
# call into them), so no source hash covers them, and a change to a search space leaves every
# recorded tile valid (tests/test_kernels_launch.py runs each template's launch with them disabled).
TILE_CHOICE_MODULES = frozenset({"vsr.kernels.gemm_tiles", "vsr.kernels.int4_tiles"})


def source_hash(*modules: ModuleType) -> str:
    """sha256 (16 hex digits) of the modules' code texts one after another."""
    h = hashlib.sha256()
    for m in modules:
        h.update(module_code_text(m).encode())
    return h.hexdigest()[:16]
