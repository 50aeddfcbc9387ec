"""The specs of the four formats vsr ships: dense, fp8, int4, nvfp4 (FORMATS.md §2-§7).

Each section holds what the format's spec adds to its kernel module: the quantization schemes it
runs, its tensors in a compressed-tensors package, its synthetic weight and its template choice.
These live here, not in dense.py / fp8.py / int4.py / nvfp4.py, because the code of those modules
is hashed into the autotune cache's keys (kernels/template.py, source_hash): loading and tuning
helpers beside the kernels would tie the cache to them.

Errors are ValueError with the sentence the runtime reports (it adds the package or group).
"""
from __future__ import annotations

import torch

from vsr.kernels import dense, fp8, int4, nvfp4
from vsr.kernels.weight_format import Record, WeightFormat

FLOATS = ("F32", "BF16", "F16")
_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _matrix(src, name: str, dtypes: tuple[str, ...]) -> tuple[int, int]:
    """(N, K) of a 2-D [N, K] tensor."""
    _, sh = src.expect(name, dtypes, None, "[N, K]")
    if len(sh) != 2:
        raise ValueError(f"tensor {name!r} expected 2 dims [N, K], got shape {list(sh)}")
    return sh


# --- dense ----------------------------------------------------------------------------------

def dense_check(src, m: str, scheme) -> tuple[int, int]:
    return _matrix(src, f"{m}.weight", FLOATS)


def dense_load(src, m: str, scheme, N: int, K: int, bias):
    return dense.DenseWeight(src.tensor(f"{m}.weight"), bias)


def dense_random(N, K, params, model_dtype, g, device):
    wd = _DTYPES[str(params.get("wdtype", str(model_dtype).removeprefix("torch.")))]
    return dense.DenseWeight((torch.randn(N, K, generator=g, device=device) * K ** -0.5).to(wd))


def dense_template(w, act_dtype: torch.dtype, emulate: bool) -> str:
    if w.weight.dtype != act_dtype:
        raise ValueError(f"dense weight is {w.weight.dtype}; activations are {act_dtype}: "
                         "cast the weight once at load, not per call")
    return "dense"


def dense_label(template_name: str, params: dict) -> str:
    wdtype = params.get("wdtype", "")
    return {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}.get(wdtype, wdtype)


DENSE = WeightFormat(
    name="dense", weight_class=dense.DenseWeight, reference=dense.reference_linear, templates=(dense.TEMPLATE,),
    choose_template=dense_template, random_weight=dense_random,
    records=tuple(Record(n, (("wdtype", d),)) for n, d in (("bf16", "bfloat16"), ("fp16", "float16"),
                                                           ("fp32", "float32"))),
    tuned_records=("bf16",), record_label=dense_label, check_tensors=dense_check, load=dense_load)


# --- fp8: FP8_DYNAMIC, e4m3 weights with a scale per output channel, e4m3 activations per token --

def fp8_scheme(w, a) -> None:
    if not (w.type == "float" and w.num_bits == 8 and w.strategy == "channel" and w.symmetric and w.dynamic is False):
        raise ValueError(f"float-quantized weights {w.type} {w.num_bits}-bit {w.strategy} (symmetric={w.symmetric}) "
                         "is unsupported; only FP8 per-channel static weights (FP8_DYNAMIC) are")
    if a is None or not (a.type == "float" and a.num_bits == 8 and a.strategy == "token"
                         and a.dynamic is True and a.symmetric):
        got = "none" if a is None else f"{a.type} {a.num_bits}-bit {a.strategy} dynamic={a.dynamic}"
        raise ValueError(f"FP8 weights with input activations {got} are unsupported; "
                         "only per-token dynamic FP8 activations (FP8_DYNAMIC) are")


def fp8_check(src, m: str, scheme) -> tuple[int, int]:
    N, K = _matrix(src, f"{m}.weight", ("F8_E4M3",))
    src.expect(f"{m}.weight_scale", FLOATS, None, f"[N, 1]=[{N}, 1]", N)
    if src.meta(f"{m}.weight_scale")[1] not in ((N, 1), (N,)):
        src.expect(f"{m}.weight_scale", FLOATS, (N, 1), f"[N, 1]=[{N}, 1]")
    return N, K


def fp8_load(src, m: str, scheme, N: int, K: int, bias):
    return fp8.Fp8Weight(src.tensor(f"{m}.weight"), src.tensor(f"{m}.weight_scale").reshape(N), bias)


def fp8_random(N, K, params, model_dtype, g, device):
    q = fp8.e4m3_rne(torch.randn(N, K, generator=g, device=device) * 64)
    return fp8.Fp8Weight(q, (torch.rand(N, generator=g, device=device) * 0.01 + 1e-3).to(model_dtype))


FP8 = WeightFormat(
    name="fp8", weight_class=fp8.Fp8Weight, reference=fp8.reference_linear, templates=(fp8.TEMPLATE,),
    choose_template=lambda w, act_dtype, emulate: "fp8_w8a8", random_weight=fp8_random,
    records=(Record("fp8"),), tuned_records=("fp8",), storage=("float-quantized",), check_scheme=fp8_scheme,
    check_tensors=fp8_check, load=fp8_load)


# --- int4: pack-quantized W4A16, GPTQ (symmetric) or AWQ (a zero point per group) -----------------

def int4_scheme(w, a) -> None:
    if not (w.type == "int" and w.num_bits == 4 and w.strategy == "group" and (w.group_size or 0) > 0
            and w.dynamic is False):
        raise ValueError(f"pack-quantized weights {w.type} {w.num_bits}-bit {w.strategy} (group_size={w.group_size}) "
                         "is unsupported; only int 4-bit group weights (W4A16) are")
    if w.actorder not in (None, "static", "weight", "group", "dynamic"):
        raise ValueError(f"unknown actorder {w.actorder!r}")
    if a is not None:
        raise ValueError(f"int4 weights with quantized input activations ({a.type} {a.num_bits}-bit) "
                         "are unsupported; only W4A16 is")


def int4_check(src, m: str, scheme) -> tuple[int, int]:
    packed = f"{m}.weight_packed"
    _, sh = src.expect(packed, ("I32",), None, "[N, ceil(K/8)]")
    if len(sh) != 2:
        raise ValueError(f"tensor {packed!r} expected 2 dims [N, ceil(K/8)], got shape {list(sh)}")
    src.expect(f"{m}.weight_shape", ("I64", "I32"), None, "[2]", 2)
    N, K = (int(v) for v in src.tensor(f"{m}.weight_shape").reshape(-1).tolist())
    if N != sh[0] or _cdiv(K, 8) != sh[1]:
        raise ValueError(f"tensor {packed!r} expected shape [N, ceil(K/8)]=[{N}, {_cdiv(K, 8)}] for "
                         f"weight_shape [{N}, {K}], got {list(sh)}")
    ng = _cdiv(K, int(scheme.group_size))
    src.expect(f"{m}.weight_scale", FLOATS, (N, ng), f"[N, ceil(K/G)]=[{N}, {ng}]")
    if not scheme.symmetric:
        src.expect(f"{m}.weight_zero_point", ("I32",), (_cdiv(N, 8), ng), f"[ceil(N/8), ceil(K/G)]=[{_cdiv(N, 8)}, {ng}]")
    if scheme.legacy_act_order or src.has(f"{m}.weight_g_idx"):
        src.expect(f"{m}.weight_g_idx", ("I32", "I64"), (K,), f"[K]=[{K}]")
    return N, K


def act_order_perm(g_idx: torch.Tensor, K: int, G: int, name: str = "weight_g_idx") -> torch.Tensor:
    """argsort(g_idx) (stable), after checking every group holds exactly G columns (the last one
    K - G*(groups-1)): the kernels need each group to be a contiguous run of G columns."""
    g = g_idx.reshape(-1).to(torch.int64)
    ng = _cdiv(K, G)
    if g.numel() != K:
        raise ValueError(f"tensor {name!r}: expected {K} entries, got {g.numel()}")
    if int(g.min()) < 0 or int(g.max()) >= ng:
        raise ValueError(f"tensor {name!r}: group indices must lie in [0, {ng}), got [{int(g.min())}, {int(g.max())}]")
    counts = torch.bincount(g, minlength=ng)
    want = torch.full((ng,), G, dtype=counts.dtype)
    want[-1] = K - G * (ng - 1)
    if not torch.equal(counts, want):
        bad = int((counts != want).nonzero()[0])
        raise ValueError(f"tensor {name!r}: group {bad} has {int(counts[bad])} columns, expected {int(want[bad])} "
                         f"(group size {G})")
    return torch.argsort(g, stable=True)


def int4_load(src, m: str, scheme, N: int, K: int, bias):
    G = int(scheme.group_size)
    packed = src.tensor(f"{m}.weight_packed")
    # A symmetric scheme has no zero point; a stray one is ignored (FORMATS.md pitfall 9). AWQ's is
    # packed along N, u-domain nibbles zu = zp + 8, its padding rows trimmed.
    zero = None if scheme.symmetric else int4.unpack_int4(src.tensor(f"{m}.weight_zero_point"), N, dim=0)
    perm = None
    if src.has(f"{m}.weight_g_idx"):
        perm = act_order_perm(src.tensor(f"{m}.weight_g_idx"), K, G, f"{m}.weight_g_idx")
        if torch.equal(perm, torch.arange(K)):
            perm = None   # groups already contiguous: no gather of x per call
    if perm is not None:
        # The weight's columns are permuted once, here, so that column j belongs to group j // G,
        # which is what scale and zero point index; x is gathered by perm on each call.
        packed = int4.pack_int4(int4.unpack_int4(packed, K)[:, perm])
    return int4.Int4Weight(packed, src.tensor(f"{m}.weight_scale"), K, G, zero, perm, bias)


# The random int4 and NVFP4 weights' spread before quantization: a trained layer's order of magnitude.
RANDOM_WEIGHT_STD = 0.02


def int4_random(N, K, params, model_dtype, g, device):
    """Codes, scales (and zero points) of N(0, RANDOM_WEIGHT_STD²) weights quantized per group as
    GPTQ and AWQ quantize: symmetric s = absmax / 7.5, u = round(w / s) + 8; asymmetric (min-max)
    s = (max - min) / 15, z = round(-min / s), u = round(w / s) + z; u and z clamped to 0..15.
    Uniform random codes, with zero points drawn independently of them, are not what a package holds, and
    the tensor cores' power follows the values: at 1,024 rows on an H100 uniform GPTQ codes kept the
    card under its 700 W cap where these (as BF16's weights) hold it there and lower its clock, and
    the 1x1024 int4 forward took 10% less with them than with these
    (benchmarks/results/ab-nvidia-h100-2026-12-07.json, "int4_realistic_weights")."""
    G = int(params.get("group", 128))
    groups = _cdiv(K, G)
    kw = {"generator": g, "device": device}
    symmetric = params.get("symmetric", True)
    w = torch.randn(N, groups, G, **kw).mul_(RANDOM_WEIGHT_STD)
    if symmetric:
        s, z = w.abs().amax(-1, keepdim=True) / 7.5, 8.0
    else:
        lo = w.amin(-1, keepdim=True)
        s = (w.amax(-1, keepdim=True) - lo) / 15
        z = torch.round(-lo / s).clamp(0, 15)
    # in place: a 27B-class gate|up weight's fp32 values are 0.7 GB, each temporary as much again
    u = w.div_(s).round_().add_(z).clamp_(0, 15).to(torch.int32).reshape(N, groups * G)[:, :K].contiguous()
    zp = None if symmetric else z.reshape(N, groups).to(torch.int32)
    perm = torch.randperm(K, **kw) if params.get("act_order") else None
    return int4.Int4Weight(int4.pack_int4(u), s.reshape(N, groups).to(model_dtype), K, G, zp, perm)


INT4 = WeightFormat(
    name="int4", weight_class=int4.Int4Weight, reference=int4.reference_linear, templates=(int4.TEMPLATE,),
    choose_template=lambda w, act_dtype, emulate: "int4_w4a16", random_weight=int4_random,
    records=(Record("int4-gptq", (("group", 128), ("symmetric", True))),
             Record("int4-awq", (("group", 128), ("symmetric", False)))),
    tuned_records=("int4-gptq", "int4-awq"),
    record_label=lambda template_name, params: "int4-gptq" if params.get("symmetric", True) else "int4-awq",
    storage=("pack-quantized",), check_scheme=int4_scheme, check_tensors=int4_check, load=int4_load)


# --- nvfp4: e2m1 weights in blocks of 16 with e4m3 block scales and a global scale ------------------

def nvfp4_scheme(w, a) -> None:
    if not (w.type == "float" and w.num_bits == 4 and w.strategy == "tensor_group" and w.group_size == 16
            and w.symmetric):
        raise ValueError(f"nvfp4-pack-quantized weights {w.type} {w.num_bits}-bit {w.strategy} "
                         f"(group_size={w.group_size}) is unsupported; only NVFP4 (float 4-bit, tensor_group of 16) is")
    if a is not None and not (a.type == "float" and a.num_bits == 4 and a.strategy == "tensor_group"
                              and a.group_size == 16 and a.dynamic == "local"):
        raise ValueError(f"NVFP4 weights with input activations {a.type} {a.num_bits}-bit {a.strategy} "
                         f"dynamic={a.dynamic!r} are unsupported; only dynamic 'local' NVFP4 activations "
                         "(or none, NVFP4A16) are")


def nvfp4_check(src, m: str, scheme) -> tuple[int, int]:
    packed = f"{m}.weight_packed"
    _, sh = src.expect(packed, ("U8",), None, "[N, K/2]")
    if len(sh) != 2 or (2 * sh[1]) % nvfp4.BLOCK:
        raise ValueError(f"tensor {packed!r} expected shape [N, K/2] with K % 16 == 0, got {list(sh)}")
    N, K = sh[0], 2 * sh[1]
    src.expect(f"{m}.weight_scale", ("F8_E4M3",), (N, K // nvfp4.BLOCK), f"[N, K/16]=[{N}, {K // 16}]")
    src.expect(f"{m}.weight_global_scale", ("F32",), None, "[1]", 1)
    if scheme.input_activations is not None:
        src.expect(f"{m}.input_global_scale", ("F32",), None, "[1]", 1)
    return N, K


def nvfp4_load(src, m: str, scheme, N: int, K: int, bias):
    igs = src.tensor(f"{m}.input_global_scale").reshape(1) if scheme.input_activations is not None else None
    return nvfp4.Nvfp4Weight(src.tensor(f"{m}.weight_packed"), src.tensor(f"{m}.weight_scale"),
                             src.tensor(f"{m}.weight_global_scale").reshape(1), igs, bias)


# The random NVFP4 weight's global scale stands for a tensor amax of 8 standard deviations (a
# 27B-class weight's largest of 10^8 Gaussians is about 6): fixed, not the weight's own amax, so
# the parts of a fused product (q, k, v; gate, up) share it as llm-compressor makes them share theirs.
NVFP4_RANDOM_AMAX = 8 * RANDOM_WEIGHT_STD


def nvfp4_random(N, K, params, model_dtype, g, device):
    """N(0, RANDOM_WEIGHT_STD²) weights quantized as llm-compressor quantizes NVFP4 (FORMATS.md §7):
    gs = 448·6 / amax, s_blk = e4m3(gs · amax_blk / 6), c = e2m1(w / (s_blk / gs)); codes as a
    package holds them, not uniform ones (int4_random says why the values matter)."""
    kw = {"generator": g, "device": device}
    gs = torch.tensor(448.0 * 6.0 / NVFP4_RANDOM_AMAX, dtype=torch.float32, device=device)
    # the weight producer's numerics are the activation quantizer's, global scale fixed (FORMATS.md §7)
    codes, s = nvfp4.quantize_activation(torch.randn(N, K, **kw).mul_(RANDOM_WEIGHT_STD), gs)
    igs = None if params.get("act", "none") == "none" else torch.tensor(448.0 * 6.0 / 4.0, dtype=torch.float32,
                                                                          device=device)
    return nvfp4.Nvfp4Weight(nvfp4.pack_fp4(codes), s, gs, igs)


def _fp4_tensor_cores(device: torch.device | None) -> bool:
    if device is None and not torch.cuda.is_available():
        return False
    return nvfp4.fp4_tensor_cores(torch.device("cuda") if device is None else device)


def nvfp4_template(w, act_dtype: torch.dtype, emulate: bool) -> str:
    """"nvfp4_w4a4" on FP4 tensor cores (compute capability 10.x/12.x), "nvfp4_emulated" only when
    emulate=True; anywhere else it raises. NVFP4A16 weights (no input_global_scale) have no
    FP4-tensor-core form: the emulation kernel is their exact kernel and needs no flag."""
    if emulate or not w.quantizes_activations:
        return "nvfp4_emulated"
    if not _fp4_tensor_cores(w.packed.device if w.packed.is_cuda else None):
        raise RuntimeError(
            "NVFP4 W4A4 needs FP4 tensor cores (NVIDIA compute capability 10.x or 12.x) for its Triton "
            "kernel; this device has none. Ask for the explicit emulation (emulate=True) to run the "
            "reference numerics instead.")
    return "nvfp4_w4a4"


_NVFP4_ACT = (("act", "e2m1-block16-dynamic"),)

NVFP4 = WeightFormat(
    name="nvfp4", weight_class=nvfp4.Nvfp4Weight, reference=nvfp4.reference_linear,
    templates=(nvfp4.TEMPLATE_W4A4, nvfp4.TEMPLATE_EMULATED), choose_template=nvfp4_template,
    random_weight=nvfp4_random, records=(Record("nvfp4", _NVFP4_ACT), Record("nvfp4-emulated", _NVFP4_ACT, True)),
    tuned_records=("nvfp4",),
    record_label=lambda template_name, params: "nvfp4-emulated" if template_name == "nvfp4_emulated" else "nvfp4",
    storage=("nvfp4-pack-quantized",), check_scheme=nvfp4_scheme, check_tensors=nvfp4_check, load=nvfp4_load)
