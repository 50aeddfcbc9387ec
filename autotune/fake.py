"""A pure-torch stand-in template, for the autotune tests and CPU demonstrations of the cache.

It behaves like a real template towards the tuner (search space, default tile,
launcher, reference, problem), computes dense products exactly (fp32
accumulation, chunked along K by the tile's BLOCK_K, which gives each tile its
own accumulation order), and has one deliberately wrong candidate
(BLOCK_K == 24 drops the last K chunk) so tests can prove a wrong tile never wins.
It is never registered with the runtime.
"""
from __future__ import annotations

import sys

import torch

from vsr.kernels.dense import DenseWeight, reference_linear
from vsr.kernels.template import Problem, Template

BROKEN_BLOCK_K = 24


def _search_space(problem: Problem) -> list[dict]:
    base = [{"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 32, "num_warps": 4, "num_stages": 2}]
    for bk in (16, BROKEN_BLOCK_K, 64):
        for bn in (32, 64):
            base.append({"BLOCK_M": min(64, max(16, problem.bucket)), "BLOCK_N": bn, "BLOCK_K": bk,
                         "num_warps": 4, "num_stages": 2})
    return base


def _default_tile(problem: Problem) -> dict:
    return _search_space(problem)[0]


def _launch(x: torch.Tensor, w: DenseWeight, tile: dict) -> torch.Tensor:
    assert x.dim() == 2 and x.shape[1] == w.K, f"x must be [M, {w.K}], got {tuple(x.shape)}"
    bk = int(tile["BLOCK_K"])
    xf, wf = x.float(), w.weight.float()
    acc = torch.zeros(x.shape[0], w.N, dtype=torch.float32, device=x.device)
    stop = w.K - bk if bk == BROKEN_BLOCK_K else w.K  # the deliberate bug
    for k0 in range(0, max(stop, 0), bk):
        acc += xf[:, k0:k0 + bk] @ wf[:, k0:k0 + bk].t()
    if w.bias is not None:
        acc += w.bias.float()
    return acc.to(x.dtype)


def _problem(w: DenseWeight, bucket: int, act_dtype: torch.dtype) -> Problem:
    return Problem(N=w.N, K=w.K, bucket=int(bucket), act_dtype=act_dtype, params=tuple(w.params()))


# The weight format synth.for_problem builds this template's weights in (no format registers it).
WEIGHT_FORMAT = "dense"

FAKE_DENSE = Template(name="fake_dense", module=sys.modules[__name__], search_space=_search_space,
                      default_tile=_default_tile, launch=_launch, reference=reference_linear, problem=_problem)
