"""QLinear: one Linear layer of a package, run either by its format's pure-torch reference or by
its Triton template (contract 4).

The weight object is the kernels' own layout (its format's weight class, kernels/formats.py), as
the loader built it. "reference" is the format's exact numerics (the CPU path and the explicit
emulation); "triton" picks the format's template from vsr.kernels.registry and asks a tile
resolver for the tile of this call's row bucket.
"""
from __future__ import annotations

import functools
from typing import Any

import torch

from vsr.autotune.buckets import bucket_for
from vsr.kernels import formats, registry
from vsr.kernels.common import glu_width

MODES = ("reference", "triton")
_RUN_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def to_run_dtype(weight: Any, dtype: torch.dtype) -> Any:
    """A DenseWeight converted to `dtype` (for --dtype float32|bfloat16|float16); quantized weights are
    returned untouched: their stored dtypes are their format, never converted to another one."""
    if dtype not in _RUN_DTYPES:
        raise ValueError(f"run dtype must be one of float32, bfloat16, float16, got {dtype}")
    if weight.format != "dense":
        return weight
    return formats.get("dense").weight_class(weight.weight.to(dtype), None if weight.bias is None else weight.bias.to(dtype))


def _out_of_resources() -> type:
    """Triton's OutOfResources (imported on an exception only)."""
    from triton.runtime.errors import OutOfResources
    return OutOfResources


def glu_reference(y: torch.Tensor) -> torch.Tensor:
    """SwiGLU of a product over interleaved gate and up rows (runtime/fuse.fuse's interleave),
    [T, 2I] -> [T, I] in y's dtype: torch's F.silu(gate) * up on its even (gate) and odd (up)
    columns, the numerics of the kernels' GLU epilogue and of activation.silu_mul."""
    return torch.nn.functional.silu(y[:, 0::2]) * y[:, 1::2]


class QLinear(torch.nn.Module):
    """forward(x[..., K]) -> [..., N] in x's dtype; with glu [..., N / 2], SwiGLU of the product
    over its interleaved gate and up rows (glu_reference): on the Triton path in the product's
    epilogue where the tile takes it (Template.glu_in_epilogue), else by the activation kernel."""

    def __init__(self, weight: Any, mode: str = "reference", tiles: Any = None, emulate: bool = False,
                 glu: bool = False):
        super().__init__()
        if mode not in MODES:
            raise ValueError(f"QLinear mode must be one of {MODES}, got {mode!r}")
        if weight.format not in formats.FORMATS:
            raise ValueError(f"QLinear: unknown weight format {weight.format!r}")
        if mode == "triton" and tiles is None:
            # No silent default: the caller decides the miss policy through its resolver.
            raise ValueError("QLinear mode 'triton' needs a tile resolver (tiles=...), e.g. "
                             "vsr.autotune.resolver.TileResolver")
        if glu and weight.N % 2:
            raise ValueError(f"QLinear glu needs interleaved gate and up rows, an even N, got N={weight.N}")
        self.weight = weight
        self.mode = mode
        self.glu = glu
        self.tiles = tiles
        # Only with an explicit opt-in may "triton" pick an emulating template (nvfp4_emulated).
        self.emulate = emulate
        self._prepare()
        # (row bucket, activation dtype) -> (template, tile): the template and tile of a call are
        # resolved once per bucket, not per call, since resolving (template choice, cache key,
        # lookup) is host work that every layer of an eager forward would repeat. Setting any of
        # _PLAN_INPUTS (a .to() move included) empties it (__setattr__).
        # A plan is (template, tile, after): `after`, where not None, applies SwiGLU to the plain
        # product of a glu QLinear whose tile does not take it in its epilogue.
        self._plans: dict[tuple[int, torch.dtype], tuple[Any, Any, Any]] = {}

    _PLAN_INPUTS = frozenset({"weight", "tiles", "emulate", "glu"})

    def __setattr__(self, name: str, value: Any) -> None:
        if name in self._PLAN_INPUTS:
            self.__dict__.get("_plans", {}).clear()  # absent while __init__ sets the inputs
        super().__setattr__(name, value)
        if name in ("weight", "mode") and "_prepared" in self.__dict__:
            self._prepare()

    def _prepare(self) -> None:
        """On the CPU, the reference path's weight side computed once (runtime.dequantized): the
        same bytes as the format's reference_linear, without rebuilding the weight every call."""
        prepared = None
        if self.mode == "reference" and self._device().type == "cpu":
            from vsr.runtime.dequantized import prepare_reference
            prepared = prepare_reference(self.weight)
        self.__dict__["_prepared"] = prepared

    @property
    def in_features(self) -> int:
        return self.weight.K

    @property
    def out_features(self) -> int:
        return glu_width(self.weight.N, self.glu)

    @property
    def format(self) -> str:
        return self.weight.format

    def nbytes(self) -> int:
        return self.weight.nbytes()

    def extra_repr(self) -> str:
        glu = f", glu={self.glu}" if self.glu else ""
        return f"format={self.weight.format}, N={self.weight.N}, K={self.weight.K}, mode={self.mode}{glu}"

    def _apply(self, fn, recurse=True):
        # The weight is a dataclass of tensors, not parameters: follow Module.to()/.cuda() moves here.
        # A dtype change (module.to(torch.float16)) converts a dense weight only; quantized tensors
        # keep their stored dtypes (fp8/e4m3 tensors are "floating point" to torch and would be cast).
        # Two probes: one float32 probe cannot tell .float() from a pure device move.
        # Probes live on the weight's device, so a dtype-only conversion moves nothing.
        dev = self._device()
        p32, p16 = fn(torch.empty(0, device=dev)), fn(torch.empty(0, dtype=torch.float16, device=dev))
        if p32.device != dev:
            self.weight = self.weight.to(p32.device)
        target = p32.dtype if p32.dtype != torch.float32 else (p16.dtype if p16.dtype != torch.float16 else None)
        if target in _RUN_DTYPES:
            self.weight = to_run_dtype(self.weight, target)
        return super()._apply(fn, recurse)

    def _device(self) -> torch.device:
        return formats.get(self.weight.format).device_of(self.weight)

    def _rows(self, x: torch.Tensor) -> torch.Tensor:
        """x [..., K] as rows [T, K]."""
        w = self.weight
        if x.shape[-1] != w.K:
            raise ValueError(f"QLinear({w.format}, N={w.N}, K={w.K}): input has {x.shape[-1]} features")
        return x.reshape(-1, w.K)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight
        lead = x.shape[:-1]
        x2 = self._rows(x)
        if x2.shape[0] == 0:
            return x.new_empty(*lead, self.out_features)
        if self.mode == "reference":
            p = self._prepared
            y = p(x2) if p is not None else formats.get(w.format).reference(x2, w)
            if self.glu:
                y = glu_reference(y)
        else:
            y = self._triton(x2)
        return y.reshape(*lead, self.out_features)

    @property
    def takes_fp8_codes(self) -> bool:
        """Whether product_fp8 runs: an fp8 weight on the Triton path."""
        return self.mode == "triton" and self.weight.format == "fp8"

    def product_fp8(self, xq: torch.Tensor, xs: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """y [M, out_features] in `dtype` from activations already quantized per row (e4m3 codes
        xq [M, K] and scales xs [M] in `dtype`, as fp8.quantize_activation_triton gives): the fp8
        template's product on this call's tile, without its own quantizing prologue."""
        if not self.takes_fp8_codes:
            raise ValueError(f"product_fp8 needs an fp8 weight on the triton path, not {self.weight.format} "
                             f"on {self.mode}")
        from vsr.kernels import fp8, gemm, pdl
        template, tile, _ = self._plan(xq.shape[0], dtype)
        y = torch.empty((xq.shape[0], self.out_features), dtype=dtype, device=xq.device)
        # within pdl.programmatic_forward: a dependent of the kernel that quantized xq (a norm or an activation)
        fp8.launch_product(xq, xs, self.weight, y, tile, wait=pdl.enabled(xq.device),
                           prefetch=gemm.PDL_PREFETCH_LINES, glu=self.glu)
        return y

    def _plan(self, rows: int, dtype: torch.dtype):
        key = (bucket_for(rows), dtype)
        plan = self._plans.get(key)
        if plan is None:
            template = registry.template_for(self.weight, dtype, emulate=self.emulate)
            tile = self.tiles.tile(template, template.problem(self.weight, key[0], dtype))
            after = None
            if self.glu and not template.glu_in_epilogue(tile):
                # the plain product over the interleaved rows, then SwiGLU as the epilogue computes it
                from vsr.kernels import activation
                after = functools.partial(activation.silu_mul, interleaved=True)
            plan = self._plans[key] = (template, tile, after)
        return plan

    def _triton(self, x2: torch.Tensor) -> torch.Tensor:
        key = (bucket_for(x2.shape[0]), x2.dtype)
        template, tile, after = self._plan(x2.shape[0], x2.dtype)
        try:
            if after is not None:
                return after(template.launch(x2.contiguous(), self.weight, tile))
            if self.glu:
                return template.launch(x2.contiguous(), self.weight, tile, glu=True)
            return template.launch(x2.contiguous(), self.weight, tile)
        except _out_of_resources() as e:   # (an except clause's class is looked up only on an exception)
            # Which layer, which tile and what to do, rather than Triton's bare resource count: a
            # tile the autotune cache lacks is the template's default, which on some devices does
            # not fit in shared memory.
            w = self.weight
            raise RuntimeError(
                f"QLinear({w.format}, N={w.N}, K={w.K}) at {x2.shape[0]} rows (bucket {key[0]}, {x2.dtype}): "
                f"the {template.name} tile {tile} does not fit this GPU ({e}). Record tiles for this device "
                f"into a new autotune cache with vsr-tune (or, if the cache lacks this key, run with "
                f"--miss-policy tune)") from e


class StackedProducts:
    """The CPU reference's one product for parts over one input that run apart on the GPU (NVFP4
    W4A4 parts whose weight global scales differ: dequantized.stack_nvfp4_parts): forward(x) ->
    [..., sum(N)], the bytes of the parts' products side by side. The parts' own references are
    replaced by views of the stacked weight; `valid()` is False once any part was re-prepared (a
    new weight or mode), and the caller then runs the parts."""

    def __init__(self, linears: list, stacked, installed: list):
        self.linears, self.stacked, self.installed = linears, stacked, installed
        self.N = sum(m.out_features for m in linears)

    def valid(self) -> bool:
        return all(m.__dict__.get("_prepared") is p for m, p in zip(self.linears, self.installed))

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        rows = self.linears[0]._rows(x)
        if rows.shape[0] == 0:
            return x.new_empty(*lead, self.N)
        return self.stacked(rows).reshape(*lead, self.N)


def stack_one_input(linears: list) -> StackedProducts | None:
    """StackedProducts over `linears` where their prepared references stack, else None."""
    if not linears or not all(isinstance(m, QLinear) for m in linears):
        return None
    from vsr.runtime.dequantized import stack_nvfp4_parts

    got = stack_nvfp4_parts([m.__dict__.get("_prepared") for m in linears], [m.weight for m in linears])
    if got is None:
        return None
    stacked, parts = got
    for m, p in zip(linears, parts):
        m.__dict__["_prepared"] = p
    return StackedProducts(linears, stacked, parts)
