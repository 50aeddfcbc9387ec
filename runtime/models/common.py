"""What every model needs from a package: linear layers and plain tensors, on a device, in a dtype."""
from __future__ import annotations

import itertools
import warnings

import torch

from vsr.runtime import fuse
from vsr.runtime.errors import PackageError
from vsr.runtime.linear import stack_one_input, to_run_dtype


class Projection(torch.nn.Module):
    """Several Linear layers over one input as one product: forward(x [T, K]) -> [T, sum(sizes)],
    the parts' outputs side by side in order (q|k|v, gate|up). `fused`: one QLinear over the
    concatenated weight (runtime/fuse.py); else `parts` are the products of consecutive runs of
    them (`runs`: how many Linear layers each product covers; fuse.fuse_runs) and their outputs
    are joined (a package whose parts cannot all share a weight; the load warns)."""

    def __init__(self, linears: list, sizes: list[int], fused: bool, runs: list[int] | None = None):
        super().__init__()
        self.parts = torch.nn.ModuleList(linears)
        self.sizes = list(sizes)
        self.fused = fused
        self.runs = [len(sizes)] if fused else list(runs or [1] * len(linears))
        if len(self.runs) != len(linears) or sum(self.runs) != len(sizes):
            raise ValueError(f"runs {self.runs} do not cover {len(sizes)} parts with {len(linears)} products")
        # Parts that cannot share a weight may still run as one product on the CPU reference path
        # (NVFP4 W4A4 parts with one input global scale: linear.stack_one_input).
        self.stacked = None if fused else stack_one_input(list(linears))

    @property
    def format(self) -> str:
        return self.parts[0].format

    @property
    def activated(self) -> str | None:
        """The activation its product applies: "silu_mul" where its one linear has the SwiGLU
        epilogue (QLinear.glu), whose output is silu(gate) · up [T, I], not the parts side by side."""
        return "silu_mul" if self.fused and getattr(self.parts[0], "glu", False) else None

    @property
    def takes_fp8_codes(self) -> bool:
        return self.fused and getattr(self.parts[0], "takes_fp8_codes", False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fused:
            return self.parts[0](x)
        if self.stacked is not None and self.stacked.valid():
            return self.stacked(x)
        return torch.cat([m(x) for m in self.parts], dim=-1)

    def product_fp8(self, xq: torch.Tensor, xs: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """The fused fp8 product of activations already quantized per row (QLinear.product_fp8)."""
        return self.parts[0].product_fp8(xq, xs, dtype)

    def split(self, at: int) -> tuple[Projection, Projection] | None:
        """The products of parts [0, at) and [at, n) as two Projections, where no product spans
        part `at` (else None: the caller slices the whole output)."""
        ends = list(itertools.accumulate(self.runs))
        if self.fused or at not in ends[:-1]:
            return None
        i = ends.index(at) + 1

        def side(a: int, b: int, lo: int, hi: int) -> Projection:   # products a..b, parts lo..hi
            runs = self.runs[a:b]
            return Projection(list(self.parts[a:b]), self.sizes[lo:hi], runs == [hi - lo] and hi - lo > 1, runs)

        return side(0, i, 0, at), side(i, len(self.runs), at, len(self.sizes))


class Builder:
    """Hands models their weights.

    loader: a vsr.runtime.loaders.PackageLoader (cpu tensors, as stored).
    make_linear(weight) -> nn.Module: wraps a weight object (already on the device) in a QLinear.
    act_dtype: the activation dtype the model computes in.
    convert_dense: when True (an explicit --dtype), dense Linear weights are converted to act_dtype,
    so the same weights run in that precision; when False they stay as stored and are upcast per call.
    Quantized weights are never converted.
    kernels: "reference" (pure torch, vsr.runtime.models.ops.REFERENCE) or "triton" (the kernels);
    exact: False runs the approximate set (engine.kernel_set).
    """

    def __init__(self, loader, make_linear, act_dtype: torch.dtype, device, convert_dense: bool,
                 kernels: str = "reference", exact: bool = True):
        if kernels not in ("reference", "triton"):
            raise ValueError(f"kernels must be 'reference' or 'triton', got {kernels!r}")
        self.kernels = kernels
        self.exact = exact
        self.loader = loader
        self.make_linear = make_linear
        self.act_dtype = act_dtype
        self.device = torch.device(device)
        self.convert_dense = convert_dense
        self.linear_bytes = 0
        self.other_bytes = 0
        self.linears: dict[str, torch.nn.Module] = {}
        # A fused product's label -> the package's Linear layers it runs (in output order).
        self.fused: dict[str, tuple[str, ...]] = {}

    def ops(self):
        """The forward's non-product operations (vsr.runtime.models.ops): the Triton kernels on the
        triton path, the pure-torch reference set otherwise."""
        from vsr.runtime.models import ops

        return ops.triton_ops() if self.kernels == "triton" else ops.REFERENCE

    def linear(self, name: str) -> torch.nn.Module:
        w = self._weight(name).to(self.device)
        self.linear_bytes += w.nbytes()
        self.linears[name] = self.make_linear(w)
        return self.linears[name]

    def _weight(self, name: str):
        w = self.loader.linear(name)
        if self.convert_dense:
            w = to_run_dtype(w, self.act_dtype)  # dense only; quantized weights stay as stored
        return w

    def projection(self, label: str, names: list[str], activation: str | None = None) -> Projection:
        """The Linear layers `names` (one input, outputs side by side) as one Projection, fused into
        one weight where their format allows (runtime/fuse.py), registered in .linears under `label`
        (e.g. "model.layers.0.self_attn.qkv"); else as the runs of them that fuse (fuse.fuse_runs,
        each under fuse.run_label) and the parts left alone (under their names), with a warning.
        activation "silu_mul" (gate|up): on the Triton path with fuse.SWIGLU_IN_PRODUCT, parts of
        fuse.GLU_FORMATS are fused with their rows interleaved and the product applies SwiGLU
        (QLinear.glu; Projection.activated says so); elsewhere the caller applies it
        (activated_product)."""
        parts = [self._weight(n) for n in names]
        glu = fuse.SWIGLU_IN_PRODUCT and activation == "silu_mul" and self.kernels == "triton" \
            and len(parts) == 2 and parts[0].format in fuse.GLU_FORMATS and parts[0].N == parts[1].N
        sizes = fuse.split_sizes(parts)
        runs = fuse.fuse_runs(parts, interleave=glu)
        whole = len(runs) == 1 and runs[0][2] is not None
        why = None if whole else fuse.why_not(parts)
        spans, weights = [(i, j) for i, j, _ in runs], [parts[i] if w is None else w for i, _, w in runs]
        del parts, runs   # the CPU copies of fused parts: only the fused weights move to the device
        mods = [self._run(fuse.run_label(label, names, i, j), names[i:j], w) for (i, j), w in zip(spans, weights)]
        if whole:
            if glu:
                mods[0].glu = True
            return Projection(mods, sizes, True)
        proj = Projection(mods, sizes, False, [j - i for i, j in spans])
        if proj.stacked is None:   # (stacked: the CPU reference runs them as one product after all)
            warnings.warn(f"{label}: {', '.join(names)} run as {len(spans)} products, not one: {why}", stacklevel=2)
        return proj

    def _run(self, key: str, names: list[str], w) -> torch.nn.Module:
        """The QLinear of one product of a projection, registered in .linears under `key` (and in
        .fused with the parts it runs, where it runs several)."""
        w = w.to(self.device)
        self.linear_bytes += w.nbytes()
        self.linears.setdefault(key, self.make_linear(w))
        if len(names) > 1:
            self.fused[key] = tuple(names)
        return self.linears[key]

    def tensor(self, name: str, dtype: torch.dtype | None = None) -> torch.Tensor:
        """A plain tensor (embedding, norm, head), in `dtype` if given, else as stored."""
        t = self.loader.tensor(name)
        if dtype is not None:
            t = t.to(dtype)
        t = t.to(self.device)
        self.other_bytes += t.numel() * t.element_size()
        return t

    def has(self, name: str) -> bool:
        return self.loader.has(name)


def _fp8_codes(proj, exact: bool) -> bool:
    """Whether the op feeding `proj` quantizes its output for it (the approximate set's FP8 fusion)."""
    return not exact and getattr(proj, "takes_fp8_codes", False)


def normed_product(ops, proj, x, weight, eps, *, residual=None, bias=None, layer=False, zero_centered=False,
                   exact=True, keep_output=True):
    """proj(norm(x + residual)) as (product, the norm's output y, the sum s = x + residual, or x).
    RMSNorm (zero_centered: Qwen3.5's), or LayerNorm with `layer` (BERT's post-LN, whose y is also
    the next residual). In the approximate set an FP8 product takes the norm's own per-row e4m3
    codes (quant_fp8), and a caller that passes keep_output=False gets no y then (None: not
    written)."""
    kw = {"residual": residual, "exact": exact}
    if _fp8_codes(proj, exact):
        kw["keep_output"] = keep_output
        y, s, xq, xs = (ops.layer_norm(x, weight, bias, eps, quant_fp8=True, **kw) if layer
                        else ops.rms_norm(x, weight, eps, zero_centered=zero_centered, quant_fp8=True, **kw))
        out = proj.product_fp8(xq, xs, x.dtype)
    else:
        y, s = (ops.layer_norm(x, weight, bias, eps, **kw) if layer
                else ops.rms_norm(x, weight, eps, zero_centered=zero_centered, **kw))
        out = proj(y)
    return out, y, (x if s is None else s)


# activated_product's act -> (the op, its arguments after h).
_ACTIVATIONS = {"silu_mul": ("silu_mul", ()), "gelu": ("gelu", ("none",)), "gelu_tanh": ("gelu", ("tanh",)),
                "gelu_mul": ("gelu_mul", ("none",)), "gelu_tanh_mul": ("gelu_mul", ("tanh",))}


def activated_product(ops, proj, h, act: str, exact: bool = True):
    """proj(act(h)): act "silu_mul" (h = gate|up), "gelu", "gelu_tanh", "gelu_mul" / "gelu_tanh_mul"
    (GeGLU, h = [act half | gate half]), "relu" or "relu_mul" (the two relu forms in torch, on
    either path)."""
    if act == "relu":
        return proj(torch.relu(h))
    if act == "relu_mul":
        i = h.shape[-1] // 2
        return proj(torch.relu(h[:, :i]) * h[:, i:])
    name, args = _ACTIVATIONS[act]
    fn = getattr(ops, name)
    if _fp8_codes(proj, exact):   # the codes alone: the activation itself is not written
        _, xq, xs = fn(h, *args, quant_fp8=True, keep_output=False)
        return proj.product_fp8(xq, xs, h.dtype)
    return proj(fn(h, *args))


def mlp_down(ops, gate_up, down, h, act: str, exact: bool = True):
    """down(act(h)), h gate_up's output: as it is where gate_up's product applied act
    (Projection.activated), else through activated_product."""
    if getattr(gate_up, "activated", None) == act:
        return down(h)
    return activated_product(ops, down, h, act, exact)


def labels(config: dict, needs: str) -> list[str]:
    """config's id2label as a list in id order (its keys strings or ints); `needs` says who needs
    them, for the error when there are none."""
    id2label = config.get("id2label")
    if not id2label:
        raise PackageError(f"config.json: {needs} needs id2label")
    return [id2label[str(i)] if str(i) in id2label else id2label[i] for i in range(len(id2label))]


def rope_theta(config: dict) -> float:
    """rope_theta from transformers 4.x ("rope_theta") or 5.x ("rope_parameters") configs."""
    params = config.get("rope_parameters") or config.get("rope_scaling") or {}
    rtype = params.get("rope_type", params.get("type", "default"))
    if rtype != "default":
        raise PackageError(f"config.json: rope_type {rtype!r} is not supported (only default RoPE)")
    theta = config.get("rope_theta", params.get("rope_theta"))
    if theta is None:
        raise PackageError("config.json: no rope_theta (neither top-level nor in rope_parameters)")
    return float(theta)


def rope_inv_freq(theta: float, dim: int, device) -> torch.Tensor:
    """RoPE's inverse frequencies of `dim` rotated columns (fp32, transformers' default RoPE)."""
    return 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float32, device=device) / dim))


def rope_cos_sin(S: int, inv_freq: torch.Tensor, dtype: torch.dtype | None = None
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [S, dim] in fp32 of positions 0..S-1 (each request's own: right padding), rounded
    to `dtype` where given: the exact q/k norm with RoPE rounds them to the activation dtype before
    use (transformers' rotary embedding returns them in it), so the same values in fewer bytes for
    every attention program that reads them."""
    t = torch.arange(S, device=inv_freq.device, dtype=torch.float32)
    f = torch.outer(t, inv_freq)
    emb = torch.cat((f, f), dim=-1)
    if dtype is not None:
        return emb.cos().to(dtype), emb.sin().to(dtype)
    return emb.cos(), emb.sin()


def request_lengths(input_ids: torch.Tensor, attention_mask: torch.Tensor,
                    lengths: torch.Tensor | None) -> torch.Tensor:
    """Each request's token count, int32 on the inputs' device (from the mask when not given)."""
    if lengths is None:
        lengths = attention_mask.sum(-1)
    return lengths.to(device=input_ids.device, dtype=torch.int32)


class DecoderRouter(torch.nn.Module):
    """What the decoder routers (Qwen3, Qwen3.5) share: grouped-query heads from the config, and the
    score head (fp32 [labels, hidden]) applied to each request's last real token. A subclass sets
    hidden, labels, ops, exact and defines encode."""

    def attention_heads(self, cfg: dict) -> None:
        """heads, kv_heads, head_dim from the config; the query heads a multiple of the key/value heads."""
        self.heads = int(cfg["num_attention_heads"])
        self.kv_heads = int(cfg.get("num_key_value_heads") or self.heads)
        self.head_dim = int(cfg.get("head_dim") or self.hidden // self.heads)
        if self.heads % self.kv_heads:
            raise PackageError(f"config.json: num_attention_heads {self.heads} is not a multiple of "
                               f"num_key_value_heads {self.kv_heads}")

    def load_score(self, b: Builder) -> None:
        self.score = b.tensor("score.weight", torch.float32)
        if tuple(self.score.shape) != (len(self.labels), self.hidden):
            raise PackageError(f"score.weight: shape {tuple(self.score.shape)}, expected "
                               f"[{len(self.labels)}, {self.hidden}] (labels x hidden_size)")

    def forward(self, input_ids, attention_mask, lengths) -> torch.Tensor:
        """Probabilities [B, L] (fp32) from the score head on each request's last real token."""
        lengths = request_lengths(input_ids, attention_mask, lengths)
        h = self.encode(input_ids, attention_mask, lengths)
        return torch.softmax(self.ops.last_token_score(h.view(-1, self.hidden), lengths, self.score), dim=-1)

    def logits(self, last_hidden: torch.Tensor) -> torch.Tensor:
        return last_hidden.float() @ self.score.t()
