"""Fused projections at load: q|k|v as one weight and gate|up as one weight, in every format.

A fused weight is the parts' output rows stacked in order (q rows, then k, then v; gate, then
up), so one product gives `[T, Nq + Nk + Nv]` whose column slices are the parts' outputs. Each
format's concatenation lives in CONCAT (keyed by weight format), one small function each:

- dense: W and bias stacked along N. The product of a row-stacked weight is the same sum per
  output column, so the reference's answer per column is unchanged (tests check the bytes).
- fp8: e4m3 codes and the per-channel scales stacked along N; the per-token activation scale is
  the same for every part (it depends on x only), so the fused product is exact.
- int4 (GPTQ/AWQ): packed words, group scales and zero points stacked along N (the words pack
  along K, the zero points are kept unpacked per output channel, so N stacks directly). An
  act-order layer's columns are stored permuted by its act_perm and x is gathered by it: parts
  fuse only when every part has the same permutation (or none). Parts with different
  permutations are not fused (`fuse` returns None and the caller keeps them separate):
  re-permuting one part's K to another's order would break its groups' contiguity.
- nvfp4: packed nibbles and e4m3 block scales stacked along N. The global scales are one scalar
  per product, so the parts fuse only when their weight_global_scale (and input_global_scale)
  are equal; calibration tools give q/k/v and gate/up a shared global scale for exactly this
  reason (llm-compressor's fused-layer global-scale update; vLLM then takes one scale for the
  fused layer). Parts with different global scales are not fused: folding the ratio of global
  scales into the e4m3 block scales would round them again and change the weights.

A part without a bias beside parts with one gets a zero bias (adding +0.0 changes no value).

SwiGLU in the product (GLU_FORMATS, on the Triton path, where SWIGLU_IN_PRODUCT, on by default):
a gate|up weight fused with its rows interleaved (gate 0, up 0, gate 1, up 1, ...;
`fuse(..., interleave=True)`) lets the product's epilogue take silu(gate) · up of each pair of
columns it holds and store [T, I] (kernels/common.store_glu_tile), so the MLP runs no activation
kernel and the product writes half the bytes. The templates of dense, FP8 W8A8 and int4 W4A16
weights take it, and the Builder gives it to all three; an FP8 down projection then quantizes its
input in its own launch (fp8.launch). int4 tiles that unpack in the kernel (the few-row paths)
leave it to the activation kernel over the interleaved columns (Template.glu_in_epilogue), with
the same bytes. nvfp4 products keep the activation kernel.
"""
from __future__ import annotations

from typing import Any, Callable

import torch

# The fused groups of each model family: fused name -> the parts' names, in output order.
FUSED_GROUPS = {"qkv": ("q", "k", "v"), "gate_up": ("gate", "up")}


def _interleaved(ts: list) -> torch.Tensor:
    """Row tensors of parts of one height taken a row of each in turn: part 0's row 0, part 1's row
    0, ..., part 0's row 1, ..."""
    return torch.stack(ts, dim=1).flatten(0, 1)


def _bias(parts: list, rows) -> torch.Tensor | None:
    if all(p.bias is None for p in parts):
        return None
    ref = next(p.bias for p in parts if p.bias is not None)
    return rows([p.bias if p.bias is not None else torch.zeros(p.N, dtype=ref.dtype, device=ref.device)
                 for p in parts])


def _same_k(parts: list) -> None:
    Ks = {p.K for p in parts}
    if len(Ks) != 1:
        raise ValueError(f"fused parts must share K (their input features), got {sorted(Ks)}")


def _dense(parts, rows):
    from vsr.kernels.dense import DenseWeight

    dtypes = {p.weight.dtype for p in parts}
    if len(dtypes) != 1:
        raise ValueError(f"dense parts of one fused weight must share a dtype, got {sorted(map(str, dtypes))}")
    return DenseWeight(rows([p.weight for p in parts]), _bias(parts, rows))


def _fp8(parts, rows):
    from vsr.kernels.fp8 import Fp8Weight

    return Fp8Weight(rows([p.weight for p in parts]), rows([p.weight_scale for p in parts]), _bias(parts, rows))


def _int4(parts, rows):
    from vsr.kernels.int4 import Int4Weight

    first = parts[0]
    if {p.group_size for p in parts} != {first.group_size}:
        return None
    if {p.symmetric for p in parts} != {first.symmetric}:
        return None
    perms = [p.act_perm for p in parts]
    if any(q is None for q in perms) != all(q is None for q in perms):
        return None
    if first.act_perm is not None and not all(torch.equal(first.act_perm, q) for q in perms[1:]):
        return None
    zero = None if first.symmetric else rows([p.zero_point for p in parts])
    return Int4Weight(rows([p.packed for p in parts]), rows([p.scale for p in parts]), first.K,
                      first.group_size, zero, first.act_perm, _bias(parts, rows))


def _nvfp4(parts, rows):
    from vsr.kernels.nvfp4 import Nvfp4Weight

    first = parts[0]
    if not all(torch.equal(first.global_scale.reshape(1), p.global_scale.reshape(1)) for p in parts[1:]):
        return None
    igs = [p.input_global_scale for p in parts]
    if any(g is None for g in igs) != all(g is None for g in igs):
        return None
    if igs[0] is not None and not all(torch.equal(igs[0].reshape(1), g.reshape(1)) for g in igs[1:]):
        return None
    return Nvfp4Weight(rows([p.packed for p in parts]), rows([p.block_scale for p in parts]),
                       first.global_scale, first.input_global_scale, _bias(parts, rows))


# weight format -> concatenate(parts, rows) -> fused weight, or None when the parts cannot share one
# product (the reason is the format's, above); rows(tensors) joins the parts' per-row tensors
# (torch.cat, or _interleaved).
CONCAT: dict[str, Callable[[list, Callable], Any]] = {"dense": _dense, "fp8": _fp8, "int4": _int4, "nvfp4": _nvfp4}


# Weight formats whose gate|up products the Builder gives the SwiGLU epilogue (launch's `glu`).
# BF16 products with it took 0.96-0.99x the plain product and the activation kernel at 1-2,048 rows
# on an H100, FP8 ones 0.95-1.02x counting the quantization the down product then runs. int4 takes
# it on its large-M tiles only (int4.glu_in_epilogue): its frag tiles, which the shipped cache runs
# at 16-256 rows, split one accumulator's columns into pairs and took 1.17x, 1.25x and 1.16x at
# 64, 128 and 256 rows.
GLU_FORMATS = ("dense", "fp8", "int4")
# Whether the Builder gives the gate|up products of GLU_FORMATS that epilogue. On: whole 27B-class
# forwards on an H100 with the H200 tiles (benchmarks/results/ab-nvidia-h100-2026-12-06.json,
# "swiglu_in_product") take 1.9-2.7% less in BF16 at 1x128, 1x1024 and 16x128 and 1.0-1.7% less
# in FP8 at 1x1024 and 16x128 (level at 1x128), with the activation kernel gone.
SWIGLU_IN_PRODUCT = True


def why_not(parts: list) -> str:
    """Why `fuse` returned None for these parts, in words (for the load message)."""
    fmt = parts[0].format
    if fmt == "int4":
        return "their int4 group sizes, zero points or act-order permutations differ"
    if fmt == "nvfp4":
        return "their NVFP4 global scales differ"
    return "their formats differ"


def fuse(parts: list, interleave: bool = False) -> Any | None:
    """One weight whose product is the parts' products side by side (in the order given), or None
    when the parts cannot share a product (different formats, or a format's own reason). With
    `interleave` (parts of one height) its rows are the parts' rows taken in turn instead: a
    gate|up weight whose product applies SwiGLU in its epilogue."""
    if len(parts) < 2:
        raise ValueError("fuse needs at least two parts")
    fmts = {p.format for p in parts}
    if len(fmts) != 1:
        return None
    _same_k(parts)
    if interleave and len({p.N for p in parts}) != 1:
        raise ValueError(f"interleaved parts must have as many rows each, got {[p.N for p in parts]}")
    return CONCAT[parts[0].format](list(parts), _interleaved if interleave else torch.cat)


def side_by_side(w: Any, in_place: bool = False) -> Any:
    """A weight that fuse(..., interleave=True) made from two parts, with its rows put back as
    fuse(parts) lays them: part 0's rows, then part 1's (a copy). A plain product of it gives the
    parts' outputs side by side, as the activation kernel takes gate|up. `in_place`: w's own row
    tensors reordered so (one row tensor's copy at a time), w returned; interleave_rows undoes it."""
    def rows(ts):
        t = torch.cat((ts[0][0::2], ts[0][1::2]))
        return ts[0].copy_(t) if in_place else t
    out = CONCAT[w.format]([w], rows)
    return w if in_place else out


def interleave_rows(w: Any) -> Any:
    """side_by_side(w, in_place=True) undone: w's row tensors interleaved again, in place; w."""
    def rows(ts):
        t, half = ts[0], ts[0].shape[0] // 2
        return t.copy_(_interleaved([t[:half], t[half:]]))
    CONCAT[w.format]([w], rows)
    return w


def fuse_runs(parts: list, interleave: bool = False) -> list[tuple[int, int, Any | None]]:
    """The parts as consecutive runs, one product each: (start, stop, fused weight) for parts
    [start, stop) that fuse (the longest such run from each start), (i, i + 1, None) for a part
    that runs alone. All the parts in one run where they fuse; otherwise each maximal run that
    does, e.g. in_proj_qkv | in_proj_z | in_proj_b | in_proj_a as qkv|z and b|a where b and a are
    left dense beside quantized qkv and z."""
    runs, i = [], 0
    while i < len(parts):
        for j in range(len(parts), i + 1, -1):
            w = fuse(parts[i:j], interleave)
            if w is not None:
                runs.append((i, j, w))
                break
        else:
            runs.append((i, i + 1, None))
            j = i + 1
        i = j
    return runs


def run_label(label: str, names: list[str], start: int, stop: int) -> str:
    """The label of the product that runs parts [start, stop) of the projection `label` over the
    Linear layers `names`: `label` for all of them, a part's own name for it alone, else the run's
    names joined by "|" after the module path they share ("model.layers.0.linear_attn.in_proj_qkv|in_proj_z")."""
    if stop - start == len(names):
        return label
    run = names[start:stop]
    path = run[0].rsplit(".", 1)[0] + "." if "." in run[0] else ""
    return path + "|".join(n[len(path):] if n.startswith(path) else n for n in run)


def split_sizes(parts: list) -> list[int]:
    """The parts' output widths, to slice a fused product's columns (torch.split)."""
    return [p.N for p in parts]
