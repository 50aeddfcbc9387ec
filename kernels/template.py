"""The interface every format template offers to the autotuner and the runtime.

A template is one Triton kernel family for one weight format. The autotuner knows
kernels only through this: a name, a hash of the template's source, a search
space and a default tile per row bucket, a launcher and the pure-torch reference
that defines the format's numerics.
"""
from __future__ import annotations

import hashlib
import inspect
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Callable

import torch

# A tile is a flat dict of ints (and the odd short string, such as the path
# "gemv" | "splitk" | "tiled"): JSON-serialisable, hashable once sorted.
Tile = dict[str, Any]


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

    @property
    def source_hash(self) -> str:
        """sha256 of the template module's source: a changed kernel never reuses old tiles."""
        return source_hash(self.module)


def source_hash(module: ModuleType) -> str:
    return hashlib.sha256(inspect.getsource(module).encode()).hexdigest()[:16]
