"""Pieces every template shares: the epilogue, the program-id swizzle, the split-K workspace and
its fixed-order reduction, the activation and output checks, the device's features, the e4m3
conversions and KernelTemplate.

Determinism: split-K partial sums go to an fp32 workspace [SPLIT, M, N] and are added in the order
s = 0, 1, ..., SPLIT-1, by a second kernel (splitk_reduce_kernel) or, with the tile field FIXUP, by
the tile's last program to finish (last_to_finish). The one atomic counts arrivals on an int32
counter; no value is ever added atomically.
"""
from __future__ import annotations

import functools
import os
import sys
import threading
from dataclasses import dataclass
from types import ModuleType

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice
from triton.language.extra.cuda import gdc_wait

from vsr.kernels.template import Template


@triton.jit
def wait_for_producer(WAIT: tl.constexpr):
    """WAIT (programmatic dependent launch, sm_90+): this grid may start while the kernel before it
    (fp8's activation prologue) still runs, so it waits here, before reading any memory, until that
    grid's writes are visible. No instruction without WAIT."""
    if WAIT:
        gdc_wait()

@triton.jit
def prefetch_weight_rows(w_ptr, stride_wn, off_n, k_lo, N, K, BLOCK_N: tl.constexpr, LINES: tl.constexpr,
                         LINE_COLS: tl.constexpr):
    """Ask the L2 for the first LINES 128-byte lines (LINE_COLS columns each) of the program's
    BLOCK_N weight rows from column k_lo. Issued before wait_for_producer, so the first loads after
    the wait hit the L2. Rows and columns past the edge are clamped (a prefetch takes no mask)."""
    rows = tl.minimum(off_n + tl.arange(0, BLOCK_N), N - 1).to(tl.int64)
    cols = tl.minimum(k_lo + tl.arange(0, LINES) * LINE_COLS, K - 1)
    tl.inline_asm_elementwise("prefetch.global.L2 [$1];\n\tmov.u32 $0, 0;", "=r,l",
                              [w_ptr + rows[:, None] * stride_wn + cols[None, :]],
                              dtype=tl.int32, is_pure=False, pack=1)

@triton.jit
def swizzle(pid, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """Map a 1-D program id to (pid_m, pid_n) in groups of GROUP_M row blocks, so that
    programs running at the same time share weight tiles in L2."""
    grid_m = tl.cdiv(M, BLOCK_M)
    grid_n = tl.cdiv(N, BLOCK_N)
    width = GROUP_M * grid_n
    group_id = pid // width
    first_m = group_id * GROUP_M
    group_size = tl.minimum(grid_m - first_m, GROUP_M)
    pid_m = first_m + (pid % width) % group_size
    pid_n = (pid % width) // group_size
    return pid_m, pid_n

@triton.jit
def tile_setup(M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """(pid_k, offs_m, offs_n, rm, rn) of a pointer-load program (grid: swizzled tiles x K splits).
    rm/rn wrap past the edge instead of masking: those results are never stored, and the loads stay
    unmasked and vectorised."""
    pid_m, pid_n = swizzle(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    return tl.program_id(1), offs_m, offs_n, (offs_m % M).to(tl.int64), (offs_n % N).to(tl.int64)

# libdevice's exp on a GPU (torch's CUDA kernels call it); Triton's own under the interpreter, which has
# no libdevice (read at import, as Triton reads the variable when a kernel is defined).
LIBDEVICE = os.environ.get("TRITON_INTERPRET", "0") != "1"
# The same, as a constexpr a kernel's helper may read as a global (store_tile's SwiGLU).
LIBDEVICE_CONST = tl.constexpr(LIBDEVICE)

@triton.jit
def exp_f32(z, LIBDEVICE: tl.constexpr):
    """exp of fp32 z: libdevice's (torch's CUDA kernels call it) on a GPU, Triton's under the interpreter."""
    if LIBDEVICE:
        return libdevice.exp(z)
    return tl.exp(z)

@triton.jit
def silu_f32(z, LIBDEVICE: tl.constexpr):
    """silu of fp32 z as torch's CUDA kernel: z / (1 + exp(-z)), IEEE division."""
    return tl.div_rn(z, 1.0 + exp_f32(-z, LIBDEVICE))

@triton.jit
def sigmoid_f32(z, LIBDEVICE: tl.constexpr):
    """sigmoid of fp32 z as torch's CUDA kernel: 1 / (1 + exp(-z)), IEEE division."""
    return tl.div_rn(tl.full(z.shape, 1.0, tl.float32), 1.0 + exp_f32(-z, LIBDEVICE))

@triton.jit
def silu_mul_f32(gate, up, DTYPE: tl.constexpr, LIBDEVICE: tl.constexpr):
    """silu(gate) · up in fp32 of gate and up already rounded to DTYPE, silu(gate) rounded to DTYPE
    before the product: torch's F.silu(gate) * up, activation.silu_mul's exact arithmetic."""
    return silu_f32(gate, LIBDEVICE).to(DTYPE).to(tl.float32) * up

# Products whose epilogue applies SwiGLU (store_tile's GLU): the weight's gate and up rows
# interleaved (gate 0, up 0, gate 1, ...), y half as wide as the product.
def glu_width(N: int, glu: bool) -> int:
    """Columns of y for a product of N weight rows: N, or N / 2 with GLU (N must be even)."""
    if not glu:
        return N
    if N % 2:
        raise ValueError(f"a SwiGLU product needs an even number of interleaved weight rows, got {N}")
    return N // 2

@triton.jit
def epilogue(acc, offs_m, offs_n, M, N, bias_ptr, rs_ptr, cs_ptr, alpha_ptr,
             HAS_BIAS: tl.constexpr, HAS_RS: tl.constexpr, HAS_CS: tl.constexpr, HAS_ALPHA: tl.constexpr):
    """acc (fp32) · row scale[m] · column scale[n] · alpha + bias[n], in that order (the
    references' order, so the rounding matches theirs)."""
    if HAS_RS:
        rs = tl.load(rs_ptr + offs_m, mask=offs_m < M, other=0.0).to(tl.float32)
        acc = acc * rs[:, None]
    if HAS_CS:
        cs = tl.load(cs_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)
        acc = acc * cs[None, :]
    if HAS_ALPHA:
        acc = acc * tl.load(alpha_ptr).to(tl.float32)
    if HAS_BIAS:
        b = tl.load(bias_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)
        acc = acc + b[None, :]
    return acc

@triton.jit
def store_or_stash(acc, y_ptr, ws_ptr, cnt_ptr, pid_k, offs_m, offs_n, M, N, stride_ym,
                   bias_ptr, rs_ptr, cs_ptr, alpha_ptr,
                   SPLIT_K: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_RS: tl.constexpr,
                   HAS_CS: tl.constexpr, HAS_ALPHA: tl.constexpr, FIXUP: tl.constexpr, GLU: tl.constexpr = False):
    """One split: the epilogue, then y. Several: the fp32 partial sum to the workspace; with FIXUP the
    tile's last split to finish adds them up here, else splitk_reduce_kernel does."""
    if SPLIT_K == 1:
        store_tile(acc, offs_m, offs_n, y_ptr, bias_ptr, rs_ptr, cs_ptr, alpha_ptr, M, N, stride_ym,
                   HAS_BIAS, HAS_RS, HAS_CS, HAS_ALPHA, GLU)
    else:
        mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
        idx = offs_m[:, None].to(tl.int64) * N + offs_n[None, :]
        tl.store(ws_ptr + pid_k.to(tl.int64) * M * N + idx, acc, mask=mask)
        if FIXUP:
            if last_to_finish(cnt_ptr + tl.program_id(0), SPLIT_K):
                store_tile(split_sum(ws_ptr, idx, mask, M, N, SPLIT_K), offs_m, offs_n, y_ptr, bias_ptr, rs_ptr,
                           cs_ptr, alpha_ptr, M, N, stride_ym, HAS_BIAS, HAS_RS, HAS_CS, HAS_ALPHA, GLU)

@triton.jit
def store_tile(acc, offs_m, offs_n, y_ptr, bias_ptr, rs_ptr, cs_ptr, alpha_ptr, M, N, stride_ym,
               HAS_BIAS: tl.constexpr, HAS_RS: tl.constexpr, HAS_CS: tl.constexpr, HAS_ALPHA: tl.constexpr,
               GLU: tl.constexpr = False):
    """y[offs_m, offs_n] = epilogue(acc); with GLU (the weight's gate and up rows interleaved)
    y[offs_m, n / 2] = silu(gate) · up of each (even n, n + 1) pair (store_glu_tile on the pairs'
    columns, split apart in registers)."""
    if not GLU:
        acc = epilogue(acc, offs_m, offs_n, M, N, bias_ptr, rs_ptr, cs_ptr, alpha_ptr,
                       HAS_BIAS, HAS_RS, HAS_CS, HAS_ALPHA)
        mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
        tl.store(y_ptr + offs_m[:, None].to(tl.int64) * stride_ym + offs_n[None, :],
                 acc.to(y_ptr.dtype.element_ty), mask=mask)
    else:
        BM: tl.constexpr = acc.shape[0]
        BN: tl.constexpr = acc.shape[1]
        gate, up = tl.split(tl.reshape(acc, (BM, BN // 2, 2)))
        half, _ = tl.split(tl.reshape(offs_n // 2, (BN // 2, 2)))
        store_glu_tile(gate, up, offs_m, half, y_ptr, bias_ptr, rs_ptr, cs_ptr, alpha_ptr, M, N, stride_ym,
                       HAS_BIAS, HAS_RS, HAS_CS, HAS_ALPHA)

@triton.jit
def store_glu_tile(gate, up, offs_m, offs_h, y_ptr, bias_ptr, rs_ptr, cs_ptr, alpha_ptr, M, N, stride_ym,
                   HAS_BIAS: tl.constexpr, HAS_RS: tl.constexpr, HAS_CS: tl.constexpr, HAS_ALPHA: tl.constexpr):
    """store_tile's GLU from the two halves held apart: gate and up (fp32) the products of weight
    rows 2h and 2h + 1 for h in offs_h (the interleaved weight's gate and up rows), each through
    the epilogue of its own row and rounded as stored, then y[offs_m, h] = silu(gate) · up."""
    dt: tl.constexpr = y_ptr.dtype.element_ty
    gate = epilogue(gate, offs_m, 2 * offs_h, M, N, bias_ptr, rs_ptr, cs_ptr, alpha_ptr,
                    HAS_BIAS, HAS_RS, HAS_CS, HAS_ALPHA)
    up = epilogue(up, offs_m, 2 * offs_h + 1, M, N, bias_ptr, rs_ptr, cs_ptr, alpha_ptr,
                  HAS_BIAS, HAS_RS, HAS_CS, HAS_ALPHA)
    y = silu_mul_f32(gate.to(dt).to(tl.float32), up.to(dt).to(tl.float32), dt, LIBDEVICE_CONST)
    mask = (offs_m[:, None] < M) & (offs_h[None, :] < N // 2)
    tl.store(y_ptr + offs_m[:, None].to(tl.int64) * stride_ym + offs_h[None, :], y.to(dt), mask=mask)

@triton.jit
def split_sum(ws_ptr, idx, mask, M, N, SPLIT_K: tl.constexpr):
    """Σ_s ws[s, idx] for s = 0, 1, ..., SPLIT_K-1 in that order, read from L2 (`.cg`): the one sum
    both forms of the reduction take, so they give the same bytes."""
    acc = tl.load(ws_ptr + idx, mask=mask, other=0.0, cache_modifier=".cg")
    for s in tl.static_range(1, SPLIT_K):
        # (M may arrive as a plain int: Triton specialises arguments equal to 1.)
        acc += tl.load(ws_ptr + tl.full((), s, tl.int64) * M * N + idx, mask=mask, other=0.0, cache_modifier=".cg")
    return acc

@triton.jit
def last_to_finish(cnt_ptr, programs):
    """The in-kernel fixup's ticket: True for the last of the `programs` programs sharing an output
    tile to arrive, after every one has stored its partial sum; that program adds the partials up
    in a fixed order, so the bytes do not depend on which one it is. The counter (tile_counters)
    counts arrivals only and the last resets it to 0 for the next launch. The barrier orders this
    program's stores before the acq_rel increment, whose acquire makes the others' partials visible
    to the last (whose reads go to L2, `.cg`)."""
    tl.debug_barrier()
    ticket = tl.atomic_add(cnt_ptr, 1, sem="acq_rel", scope="gpu")
    last = ticket == programs - 1
    if last:
        tl.atomic_xchg(cnt_ptr, 0, sem="relaxed", scope="gpu")
        # Every thread's reads after the acquire, whatever Triton does to share the ticket.
        tl.debug_barrier()
    return last

@triton.jit
def splitk_reduce_kernel(ws_ptr, y_ptr, bias_ptr, rs_ptr, cs_ptr, alpha_ptr, M, N, stride_ym,
                         SPLIT_K: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_RS: tl.constexpr,
                         HAS_CS: tl.constexpr, HAS_ALPHA: tl.constexpr,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GLU: tl.constexpr = False):
    """y = epilogue(Σ_s ws[s]) with s in a fixed order: the deterministic split-K reduction."""
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    idx = offs_m[:, None].to(tl.int64) * N + offs_n[None, :]
    store_tile(split_sum(ws_ptr, idx, mask, M, N, SPLIT_K), offs_m, offs_n, y_ptr, bias_ptr, rs_ptr, cs_ptr,
               alpha_ptr, M, N, stride_ym, HAS_BIAS, HAS_RS, HAS_CS, HAS_ALPHA, GLU)

# Host-side integer helpers: from Triton 3.5 on triton.cdiv and triton.next_power_of_2 are constexpr
# functions whose wrapper costs microseconds per host call.
def cdiv(a: int, b: int) -> int:
    return -(-a // b)

def next_pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()

# The activation dtypes every template's launcher takes (fp32 at f32_precision's precision).
ACT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)

def f32_precision(x: torch.Tensor) -> str:
    """tl.dot's input_precision for a product of x's dtype: "" for 16- and 8-bit operands, whose
    products are exact. fp32 on an NVIDIA GPU: "tf32x3", each operand split into a TF32 high part
    and a TF32 remainder and the three larger of the four partial products taken on the tensor
    cores (the remainders' product, under 2^-22 of |a·b|, is dropped): about fp32's accuracy, at a
    multiple of the speed of IEEE products, which Triton runs as FMA loops on the CUDA cores.
    Elsewhere (AMD's Triton has no tf32x3; the interpreter multiplies in fp32 whatever it is told)
    "ieee"."""
    if x.dtype != torch.float32:
        return ""
    return "tf32x3" if device_features(x.device).nvidia else "ieee"

def check_activation(x: torch.Tensor, K: int, device: torch.device, kernel: str) -> torch.Tensor:
    """x checked (2-D, K columns, one of ACT_DTYPES, the weight's device), with unit column stride."""
    assert x.dim() == 2 and x.shape[1] == K, f"x must be [M, K={K}], got {tuple(x.shape)}"
    assert x.dtype in ACT_DTYPES, \
        f"{kernel} kernel takes {'/'.join(str(d)[6:] for d in ACT_DTYPES)} activations, got {x.dtype}"
    assert x.device == device, f"x on {x.device}, weight on {device}"
    return x if x.stride(1) == 1 else x.contiguous()

class MatrixWeight:
    """N and K of a weight stored whole as `weight` [N, K] (dense, fp8): a mixin adding no fields."""

    @property
    def N(self) -> int:
        return self.weight.shape[0]

    @property
    def K(self) -> int:
        return self.weight.shape[1]

def output(x: torch.Tensor, N: int, out: torch.Tensor | None) -> torch.Tensor:
    y = out if out is not None else torch.empty((x.shape[0], N), dtype=x.dtype, device=x.device)
    assert y.shape == (x.shape[0], N) and y.dtype == x.dtype and y.stride(1) == 1, "out must be [M, N] in x's dtype"
    return y

def workspace(split: int, y: torch.Tensor, N: int | None = None) -> torch.Tensor:
    """The fp32 partial products of `split` K splits, [split, M, N] (N: the product's columns, y's
    unless a SwiGLU epilogue halves y); y itself (unused) for one split."""
    shape = (split, y.shape[0], y.shape[1] if N is None else N)
    return torch.empty(shape, dtype=torch.float32, device=y.device) if split > 1 else y

@dataclass(frozen=True)
class DeviceFeatures:
    """What the launchers ask of a device. On a CPU device (the interpreter) everything is False and
    capability None; the interpreter on a CUDA device is not supported (no griddepcontrol, no PTX)."""

    nvidia: bool                          # a CUDA device of NVIDIA's (not ROCm): inline PTX applies
    capability: tuple[int, int] | None    # compute capability of a CUDA device
    pdl: bool            # programmatic dependent launch (griddepcontrol): NVIDIA sm_90+
    hardware_e4m3: bool  # fp32 -> e4m3 converted in hardware, to nearest even as torch's cast: NVIDIA sm_89+
    shared_memory: int | None = None   # bytes of shared memory one program may use (None: unknown, CPU)

def device_features(device: torch.device) -> DeviceFeatures:
    """The DeviceFeatures of `device`, once per device (an index-less "cuda" is the current one)."""
    return _device_features(_indexed(device))


@functools.cache
def _device_features(device: torch.device) -> DeviceFeatures:
    cap = tuple(torch.cuda.get_device_capability(device)) if device.type == "cuda" else None
    nv = device.type == "cuda" and torch.version.hip is None
    return DeviceFeatures(nvidia=nv, capability=cap, pdl=nv and cap >= (9, 0), hardware_e4m3=nv and cap >= (8, 9),
                          shared_memory=_max_shared_memory(device))


def _max_shared_memory(device: torch.device) -> int | None:
    if device.type != "cuda":
        return None
    try:
        from triton.runtime import driver
        return int(driver.active.utils.get_device_properties(device.index or 0)["max_shared_mem"])
    except Exception:  # older/newer Triton layouts: fall back on torch's figure
        props = torch.cuda.get_device_properties(device)
        return int(getattr(props, "shared_memory_per_block_optin", 0)) or None

def pdl_option(wait: bool) -> dict:
    """The launch option for programmatic dependent launch, given only when the launch waits:
    Triton's HIP backend refuses a launch that names launch_pdl at all, False included."""
    return {"launch_pdl": True} if wait else {}

def pdl_supported(device: torch.device) -> bool:
    return device_features(device).pdl

def split_plan(K: int, tile: dict) -> tuple[int, int]:
    """(K columns per split, splits launched): each split a whole number of BLOCK_K steps, so a step
    never straddles a quantization group."""
    bk = tile["BLOCK_K"]
    split = max(1, int(tile.get("SPLIT_K", 1)))
    k_split = cdiv(cdiv(K, split), bk) * bk
    return k_split, cdiv(K, k_split)

def split_fixup(tile: dict, split: int) -> bool:
    """Whether `split` (> 1) partial sums are added in the product kernel (tile field FIXUP)."""
    return split > 1 and bool(tile.get("FIXUP", 0))

# tile_counters' buffers, by (device, stream), and the smaller ones they replaced (kept: a CUDA
# graph captured while one was current still uses it).
_COUNTERS: dict = {}
_RETIRED: list = []
# Counters for launches captured in CUDA graphs, by device: [a buffer zeroed outside any capture,
# the index of its first counter not yet handed out, how many buffers the device has had]. Each
# slice goes to one captured launch, so graphs share counters with nothing, and a graph holds no
# zeroing node (one per captured launch costs 1-2 us on the H200). The buffers only grow:
# CAPTURE_POOL_COUNTERS int32s each, at most CAPTURE_POOLS_MAX per device (64 MiB), after which a
# captured launch zeroes its own counters in the graph.
_CAPTURE_POOLS: dict = {}
CAPTURE_POOL_COUNTERS = 1 << 20
CAPTURE_POOLS_MAX = 16
# One lock for all of the above: launches may come from several threads (the tuner warms its
# candidates up in a thread pool), and a buffer made twice at once would lose one to the other.
_COUNTERS_LOCK = threading.Lock()

def tile_counters(device: torch.device, tiles: int) -> torch.Tensor:
    """int32 arrival counters for `tiles` output tiles of an in-kernel fixup (last_to_finish).
    Eager: one buffer per (device, stream), left at zero by every launch (its last arrival on each
    tile resets the counter); a buffer outgrown is kept, so a graph captured with it stays valid.
    While a CUDA graph is captured: counters for this launch alone (_captured_counters)."""
    device = _indexed(device)
    with _COUNTERS_LOCK:
        if device.type == "cuda":
            if torch.cuda.is_current_stream_capturing():
                return _captured_counters(device, tiles)
            _refill_capture_pool(device)
            key = (device, torch.cuda.current_stream(device).cuda_stream)
        else:
            key = (device, 0)
        c = _COUNTERS.get(key)
        if c is None or c.numel() < tiles:
            if c is not None:
                _RETIRED.append(c)
            c = _COUNTERS[key] = torch.zeros(max(1024, next_pow2(tiles)), dtype=torch.int32, device=device)
        return c

def _indexed(device: torch.device) -> torch.device:
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device

def _captured_counters(device: torch.device, tiles: int) -> torch.Tensor:
    """A captured launch's counters (under _COUNTERS_LOCK): the next `tiles` of the device's capture
    pool; where the pool lacks them, a buffer zeroed in the graph."""
    pool = _CAPTURE_POOLS.get(device)
    if pool is not None and pool[1] + tiles <= pool[0].numel():
        start = pool[1]
        pool[1] = start + tiles
        return pool[0][start:start + tiles]
    return torch.zeros(tiles, dtype=torch.int32, device=device)

def _refill_capture_pool(device: torch.device) -> None:
    """Outside a capture, under _COUNTERS_LOCK: a new zeroed pool when the device has none or less
    than half of one left, up to CAPTURE_POOLS_MAX; the old one is kept for the graphs that use it."""
    pool = _CAPTURE_POOLS.get(device)
    if pool is not None and (pool[0].numel() - pool[1] >= CAPTURE_POOL_COUNTERS // 2 or pool[2] >= CAPTURE_POOLS_MAX):
        return
    buf = torch.zeros(CAPTURE_POOL_COUNTERS, dtype=torch.int32, device=device)
    # Zero before any graph that takes a slice can run, whichever stream replays it.
    torch.cuda.current_stream(device).synchronize()
    if pool is not None:
        _RETIRED.append(pool[0])
    _CAPTURE_POOLS[device] = [buf, 0, 1 if pool is None else pool[2] + 1]

def capture_counters_mark() -> dict:
    """Where every device's capture pool stands (rewind_capture_counters)."""
    with _COUNTERS_LOCK:
        return {d: (pool[0].data_ptr(), pool[1]) for d, pool in _CAPTURE_POOLS.items()}

def rewind_capture_counters(mark: dict) -> None:
    """Hand out again the counters given to captured launches since `mark`. Only for a caller that
    has destroyed every graph captured since, after their last replay (or whose capture failed):
    the autotuner's graph timer, so that a long sweep does not use up the pools."""
    with _COUNTERS_LOCK:
        for d, (ptr, index) in mark.items():
            pool = _CAPTURE_POOLS.get(d)
            if pool is not None and pool[0].data_ptr() == ptr and pool[1] >= index:
                pool[1] = index

def fixup_counters(fixup: bool, device: torch.device, tiles: int, unused: torch.Tensor) -> torch.Tensor:
    """The counters argument of a product kernel: tile_counters with FIXUP, else `unused` (never read)."""
    return tile_counters(device, tiles) if fixup else unused

def reduce_splits(ws, y, split, M, N, bias, rs, cs, alpha, glu: bool = False):
    dummy = ws
    grid = (cdiv(M, 16), cdiv(N, 128))
    splitk_reduce_kernel[grid](
        ws, y, bias if bias is not None else dummy, rs if rs is not None else dummy,
        cs if cs is not None else dummy, alpha if alpha is not None else dummy,
        M, N, y.stride(0), SPLIT_K=split, HAS_BIAS=bias is not None, HAS_RS=rs is not None,
        HAS_CS=cs is not None, HAS_ALPHA=alpha is not None, BLOCK_M=16, BLOCK_N=128, GLU=glu,
        num_warps=4)

def check_tile(t: dict, wide_paths: tuple = ()) -> None:
    """A tile from a cache file is data: refuse one missing a field, and a wide one (BLOCK_N2) unless
    its path is one of `wide_paths` and it is not persistent (any other kernel drops the second block)."""
    for k in ("BLOCK_M", "BLOCK_N", "BLOCK_K", "SPLIT_K", "num_warps", "num_stages"):
        if k not in t:
            raise ValueError(f"tile {t} lacks {k}")
    if t.get("BLOCK_N2") and (t.get("path") not in wide_paths or t.get("PERSISTENT")):
        raise ValueError(f"tile {t}: BLOCK_N2 (a wide tile) is a field of one-tile-per-program "
                         f"{' or '.join(wide_paths) or 'no'} tiles of this template")

@triton.jit
def abs_bits(v):
    """|v| as the int32 bits of its fp32 value, ordered as the values with NaN above inf: an integer
    max is the amax and keeps a NaN, as torch's amax does (a float max drops it)."""
    return v.to(tl.float32).to(tl.int32, bitcast=True) & 0x7FFFFFFF

@triton.jit
def clamp_keep_nan(v, bound):
    """v clamped to [-bound, bound] as torch.clamp does: a NaN stays NaN."""
    return tl.minimum(tl.maximum(v, -bound, propagate_nan=tl.PropagateNan.ALL), bound,
                      propagate_nan=tl.PropagateNan.ALL)

# e4m3 conversions in integer arithmetic: the Triton interpreter's fp32 -> float8e4nv cast rounds
# wrongly (Triton 3.9: -126.3 -> -64, ties not to even); these give torch's bits on every backend.

@triton.jit
def e4m3_encode(v):
    """fp32 (clamped to ±448) -> e4m3fn code (uint8), round to nearest even as torch's cast; a NaN
    -> 0x7F (NaN signs differ between CPU and GPU: callers compare NaN rows sign-blind)."""
    nan = v != v
    v = tl.where(nan, 0.0, v)
    bits = v.to(tl.uint32, bitcast=True)
    sign = (bits >> 31) & 1
    a = tl.abs(v)
    abits = a.to(tl.uint32, bitcast=True)
    # Normal range (a >= 2^-6): keep 3 mantissa bits, round half to even via the carry trick.
    lsb = (abits >> 20) & 1
    r = abits + 0x7FFFF + lsb
    e = (r >> 23).to(tl.int32) - 127 + 7
    code_n = (e << 3) | ((r >> 20) & 7).to(tl.int32)
    # Subnormal range: multiples of 2^-9, rounded half to even (8 becomes the first normal).
    t = a * 512.0
    fl = tl.floor(t)
    frac = t - fl
    fli = fl.to(tl.int32)
    up = (frac > 0.5) | ((frac == 0.5) & ((fli & 1) == 1))
    code_s = fli + up.to(tl.int32)
    code = tl.where(a >= 0.015625, code_n, code_s)
    return tl.where(nan, 0x7F, code | (sign.to(tl.int32) << 7)).to(tl.uint8)

@triton.jit
def e4m3_decode(code):
    """e4m3fn code (any int type) -> fp32, exact; 0x7F and 0xFF give NaN."""
    c = code.to(tl.int32) & 0xFF
    e = (c >> 3) & 15
    m = c & 7
    normal = (((e + 120) << 23) | (m << 20)).to(tl.float32, bitcast=True)
    sub = m.to(tl.float32) * 0.001953125
    mag = tl.where(e == 0, sub, normal)
    mag = tl.where((c & 0x7F) == 0x7F, float("nan"), mag)
    return tl.where((c & 0x80) != 0, -mag, mag)

@dataclass(frozen=True)
class KernelTemplate(Template):
    """A Template whose source hash also covers the modules its kernels call into: this one, gemm.py
    and its `deps` (dense for int4, fp8 for nvfp4). A change there must not reuse tiles recorded for
    the old code: the cache promises the same kernel source for the same key. (gemm_tiles.py, the
    shared tile spaces, only chooses tiles: template.TILE_CHOICE_MODULES.)"""

    deps: tuple[ModuleType, ...] = ()

    @property
    def modules(self) -> tuple[ModuleType, ...]:
        from vsr.kernels import gemm   # (it imports this module: not at its top)
        return tuple(dict.fromkeys((self.module, sys.modules[__name__], gemm) + tuple(self.deps)))


# The int4 pair conversion (NVIDIA PTX): t holds u_lo in bits 0-3 and u_hi in bits 16-19; LOP3 puts
# 128 + u (bf16) or 1024 + u (fp16) in both halves' mantissas, one exact packed subtraction of zz
# (that bias + zu) and one packed multiply by ss (the scale in both halves) round (u - zu)·s once,
# as int4._int4_dequant_kernel's fp32 product and cast do. The text of int4's frag kernel (Triton)
# and of int4_wgmma's unpackers (Gluon, which cannot call a Triton function).
INT4_PAIR_PTX_BF16 = tl.constexpr(
    "{ .reg .b32 t; lop3.b32 t, $2, 0x000F000F, 0x43004300, 0xEA; sub.rn.bf16x2 t, t, $3; "
    "mul.rn.bf16x2 t, t, $4; mov.b32 {$0, $1}, t; }")
INT4_PAIR_PTX_F16 = tl.constexpr(
    "{ .reg .b32 t; lop3.b32 t, $2, 0x000F000F, 0x64006400, 0xEA; sub.rn.f16x2 t, t, $3; "
    "mul.rn.f16x2 t, t, $4; mov.b32 {$0, $1}, t; }")
