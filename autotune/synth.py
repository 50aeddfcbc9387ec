"""Random weights and activations for tuning a key when no real weights are at hand.

A tile depends on the shape, the format and its parameters, never on the values, so
`vsr-tune 27b` and a resolver with policy "tune" time candidates on random data of the
key's exact layout (random, never zeros: BENCHMARKS.md method). Built from the format
parameters of the Problem, which the weight classes' params() define.
"""
from __future__ import annotations

import torch

from vsr.kernels import dense, fp8, int4, nvfp4

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def weight_format(template_name: str) -> str:
    """The weight format a template computes ("dense", "fp8", "int4", "nvfp4")."""
    for fmt, prefixes in (("fp8", ("fp8",)), ("int4", ("int4",)), ("nvfp4", ("nvfp4",))):
        if template_name.startswith(prefixes):
            return fmt
    return "dense"


def random_weight(fmt: str, N: int, K: int, params: dict, model_dtype: torch.dtype,
                  device: torch.device | str = "cpu", seed: int = 0):
    """A weight object of format `fmt` with shape [N, K] and the given format parameters, made on
    `device` directly (a 27B-class layer made on the CPU would cost seconds per weight)."""
    device = torch.device(device)
    g = torch.Generator(device=device).manual_seed(seed)
    kw = {"generator": g, "device": device}
    if fmt == "dense":
        wd = _DTYPES[str(params.get("wdtype", str(model_dtype).removeprefix("torch.")))]
        w = dense.DenseWeight((torch.randn(N, K, **kw) * K ** -0.5).to(wd))
    elif fmt == "fp8":
        q = fp8.e4m3_rne(torch.randn(N, K, **kw) * 64)
        scale = (torch.rand(N, **kw) * 0.01 + 1e-3).to(model_dtype)
        w = fp8.Fp8Weight(q, scale)
    elif fmt == "int4":
        G = int(params.get("group", 128))
        groups = -(-K // G)
        u = torch.randint(0, 16, (N, K), dtype=torch.int32, **kw)
        scale = (torch.rand(N, groups, **kw) * 0.02 + 1e-3).to(model_dtype)
        zp = None if params.get("symmetric", True) else torch.randint(0, 16, (N, groups), dtype=torch.int32, **kw)
        perm = torch.randperm(K, **kw) if params.get("act_order") else None
        w = int4.Int4Weight(int4.pack_int4(u), scale, K, G, zp, perm)
    elif fmt == "nvfp4":
        packed = torch.randint(0, 256, (N, K // 2), dtype=torch.int32, **kw).to(torch.uint8)
        bs = (torch.rand(N, K // nvfp4.BLOCK, **kw) * 2 + 0.25).to(torch.float8_e4m3fn)
        gs = torch.tensor(448.0 * 6.0 / 2.0, dtype=torch.float32, device=device)
        igs = None if params.get("act", "none") == "none" else torch.tensor(448.0 * 6.0 / 4.0, dtype=torch.float32, device=device)
        w = nvfp4.Nvfp4Weight(packed, bs, gs, igs)
    else:
        raise ValueError(f"cannot synthesise a weight of format {fmt!r}")
    return w


def random_activations(M: int, K: int, dtype: torch.dtype, device, seed: int = 1) -> torch.Tensor:
    device = torch.device(device)
    g = torch.Generator(device=device).manual_seed(seed)
    return torch.randn(M, K, generator=g, device=device).to(dtype)


def for_problem(template, problem, device, seed: int = 0):
    """(weight, x) for tuning `problem`: x has `bucket` rows, the most the bucket serves."""
    w = random_weight(weight_format(template.name), problem.N, problem.K, dict(problem.params),
                      problem.act_dtype, device, seed)
    x = random_activations(problem.bucket, problem.K, problem.act_dtype, device, seed + 1)
    return w, x
