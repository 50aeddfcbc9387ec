"""The tile search: prune, compile in parallel, check against the reference, time, pick.

`sweep(template, weight, x)` returns one dict per candidate tile, best first:
{"tile", "ms", "ok", "error", "index", "graph"}. A candidate may win only if it
compiled, its output matched the template's reference within the tolerance of
the activation dtype, and two runs gave byte-identical outputs (the cache
promises bit-identical answers across processes). Times are medians of CUDA
graph replays (eager on CPU, or when a launcher cannot be captured; the result
says which). Ties (within TIE_FRACTION of the best) go to the earliest
candidate in search-space order, so the default tile, listed first, wins ties
and re-tuning is stable.
"""
from __future__ import annotations

import copy
import functools
import json
import math
import statistics
import threading
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

import torch

from vsr.autotune.buckets import bucket_for
from vsr.kernels import common
from vsr.kernels.template import path_group

TIE_FRACTION = 0.01

# (rtol, atol as a fraction of max|reference|) by output dtype. fp32 products are IEEE or
# tf32x3 (kernels.common.f32_precision: within about 2^-21 of each exact product), so the
# accumulation order is nearly all that differs from the reference.
TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float32: (1e-4, 1e-5),
    torch.float16: (2e-3, 1e-3),
    torch.bfloat16: (1.6e-2, 8e-3),
}

# Products of 8-bit float operands (FP8 W8A8) accumulate on Hopper's tensor cores in reduced
# precision inside each dot, as _scaled_mm(use_fast_accum=True) does: whatever the output
# dtype, such a kernel is held to this bound, looser than fp16's (and than fp32's). (Seen on
# the H200: fp8 keys with fp32 activations failed the fp32 bound and went unrecorded.)
FP8_OPERAND_TOLERANCE: tuple[float, float] = (4e-3, 4e-3)


def tolerance_for(problem, out_dtype: torch.dtype) -> tuple[float, float]:
    """The reference-check bound of one problem: its output dtype's, loosened to at least
    FP8_OPERAND_TOLERANCE when the kernel multiplies quantized 8-bit float activations."""
    base = TOLERANCES.get(out_dtype, TOLERANCES[torch.bfloat16])
    act = str(problem.param("act", "") or "") if problem is not None else ""
    if act.startswith("e4m3"):
        return tuple(max(a, b) for a, b in zip(base, FP8_OPERAND_TOLERANCE))  # type: ignore[return-value]
    return base


# Process-wide count of timing calls: a process that only loads hits must end with 0.
_timing_lock = threading.Lock()
TIMING_CALLS = 0

Timer = Callable[[Callable[[], Any]], float]


def timing_calls() -> int:
    return TIMING_CALLS


def _count_timing() -> None:
    global TIMING_CALLS
    with _timing_lock:
        TIMING_CALLS += 1


def _spread(items: list, k: int) -> list:
    """k of items evenly spread, the first and (for k >= 2) the last included, in their order."""
    if k >= len(items):
        return list(items)
    if k <= 1:
        return items[:k]
    return [items[round(i * (len(items) - 1) / (k - 1))] for i in range(k)]


def candidates(space: list, n: int | None, group: Callable[[Any], Any] = path_group) -> list:
    """At most n tiles of a search space, the default (first) always, in search-space order (so
    ties still go to the earlier tile). The spaces list tiles grouped by path and shape; their
    first n alone would be one corner (at bucket 256, TMA tiles only).

    The pick is shared among groups of tiles: `group(tile)`, the template's pick_group (its path,
    and kernel forms that few tiles of a path stand for on their own), called a path below.
    When n - 1 >= 2 x the number of paths in the rest (the tiles after the default), the n-1 are
    shared out round robin among those paths (fewest tiles first in each round), each share spread
    over its path: a share of two or more includes the path's first and last tile, a share of
    one its first; a path with fewer tiles than its turn gets them all (an even spread over the
    whole space would show a path of few tiles, such as int4's 3-5 "join" tiles of 54-82, at most
    once). Below that n (e.g. n <= 12 for int4's six groups at buckets 32-128) the n-1
    are spread evenly over the whole rest, its first and last included. With n == 2 the one
    other tile is the last: the far end from the default."""
    if n is None or len(space) <= max(1, n):
        return list(space)
    if n <= 1:
        return space[:1]
    rest = space[1:]
    groups: dict[Any, list[int]] = {}
    for i, t in enumerate(rest):
        groups.setdefault(group(t), []).append(i)
    if len(groups) > 1 and n - 1 >= 2 * len(groups):
        shares = dict.fromkeys(groups, 0)
        left = n - 1
        # Each round serves the paths with the fewest tiles first (ties: first appearance), so a
        # form of a few tiles (wide, tall) is seen whole before a long path's next turn; the long
        # paths (plain TMA tiles, pointer loads) then get fewer picks.
        order = sorted(groups, key=lambda g: len(groups[g]))
        while left:
            for g in order:
                members = groups[g]
                if left and shares[g] < len(members):
                    shares[g] += 1
                    left -= 1
        chosen = sorted(i for g, members in groups.items() for i in _spread(members, shares[g]))
        return [space[0]] + [rest[i] for i in chosen]
    if n == 2:
        return [space[0], rest[-1]]
    return [space[0]] + _spread(rest, n - 1)


def with_incumbents(tiles: list, space: list, incumbents: list) -> list:
    """`tiles` (a pick from `space`) plus each incumbent tile that `space` still holds and the pick
    left out, in the given order after the pick (so ties still go to the pick's earlier tiles).
    Incumbents are the tiles that won this key before (vsr-tune --incumbents): with them a re-tune
    at max-candidates n cannot lose a tile it already had when a changed space moves the pick."""
    out = list(tiles)
    have = {tile_json(t) for t in out}
    held = {tile_json(t) for t in space}
    for t in incumbents:
        tj = tile_json(t)
        if tj in held and tj not in have:
            have.add(tj)
            out.append(dict(t))
    return out


def tile_json(tile: dict) -> str:
    return json.dumps(tile, sort_keys=True, separators=(",", ":"))


# --- pruning -------------------------------------------------------------------------------

def _get(tile: dict, *names: str, default=None):
    for n in names:
        if n in tile:
            return tile[n]
    return default


_WEIGHT_BYTES = {"fp8": 1.0, "int4": 0.5, "nvfp4": 0.5}


def prune_reason(tile: dict, weight, x: torch.Tensor, smem_limit: int | None) -> str | None:
    """Why `tile` cannot fit (shared memory or registers), or None. Only tiles that name their
    block sizes can be judged; anything else is left to the compiler (a failure is a rejection)."""
    bm = _get(tile, "BLOCK_M", "BM")
    bn = _get(tile, "BLOCK_N", "BN")
    if isinstance(bn, int):
        bn += int(tile.get("BLOCK_N2", 0))   # a wide tile's second block of weight rows
    bk = _get(tile, "BLOCK_K", "BK")
    warps = _get(tile, "num_warps", "warps", default=4)
    stages = _get(tile, "num_stages", "stages", default=1)
    if not all(isinstance(v, int) for v in (bm, bn, bk, warps, stages)):
        return None
    fmt = getattr(weight, "format", "dense")
    w_bytes = _WEIGHT_BYTES.get(fmt, float(getattr(getattr(weight, "weight", None), "element_size", lambda: 2)()))
    # Lower bound: quantizing formats may stage activations at one byte; overestimating would prune good tiles.
    a_bytes = 1.0 if fmt in ("fp8", "nvfp4") else float(x.element_size())
    smem = stages * (bm * bk * a_bytes + bn * bk * w_bytes)
    if smem_limit is not None and smem > smem_limit:
        return f"pruned: needs ~{int(smem)} B of shared memory, the device has {smem_limit}"
    # fp32 accumulator registers per thread; a tile with PARTS runs that many MMA partitions of
    # num_warps each, every one holding its share of the weight rows (int4_wgmma's RS form)
    acc_regs = bm * bn / (32 * max(1, warps) * int(tile.get("PARTS", 1)))
    if acc_regs > 255:
        return f"pruned: the accumulator alone needs {acc_regs:.0f} registers per thread (max 255)"
    return None


# --- timing --------------------------------------------------------------------------------

def eager_timer(fn: Callable[[], Any], reps: int = 5) -> float:
    """Median wall time of `reps` calls (CPU or, with synchronisation, a GPU)."""
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    fn()
    sync()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def capture_graph(fn: Callable[[], Any], target_ms: float = 2.0) -> tuple[Any, int, dict]:
    """(CUDA graph of n back-to-back calls of fn, n, the capture-counter mark taken before it): fn
    warmed up off the default stream (as capture requires), n sized to ~target_ms, the graph
    replayed once. The caller destroys the graph after its last replay and then rewinds the
    counters to the mark (kernels/common.py rewind_capture_counters); a failed capture rewinds
    them itself (nothing captured will run) and raises."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
        start.record(stream)
        fn()
        end.record(stream)
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    est = max(start.elapsed_time(end), 1e-3)
    n = max(1, min(200, math.ceil(target_ms / est)))
    mark = common.capture_counters_mark()
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            for _ in range(n):
                fn()
    except BaseException:
        # The sweep falls back to eager timing for a launcher that cannot be captured.
        common.rewind_capture_counters(mark)
        raise
    graph.replay()
    torch.cuda.synchronize()
    return graph, n, mark


def replay_ms(graph) -> float:
    """One replay of `graph`, timed with CUDA events (ms)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end)


# Under a compute-bound product's sustained load the H200 is power-limited: a graph replayed back to
# back can run up to 17% faster for its first 25-50 ms than from about 100 ms on, so a candidate timed in
# a few tens of milliseconds after lighter work (the first of a sweep, or the one after a slow
# candidate) could win by that much. From STEADY_FROM_BUCKET rows a candidate whose call takes
# STEADY_MIN_CALL_MS or more is timed in its own steady state: its graph replayed for
# STEADY_WARM_MS first. Both bounds are judgement: 256 rows is about where the 27B-class products
# turn compute-bound (at 16 rows the order of the cases moves a figure by 3.2% at most), and the
# bound on the call keeps small layers (the built-in router's) quick to tune.
STEADY_WARM_MS = 200.0
STEADY_FROM_BUCKET = 256
STEADY_MIN_CALL_MS = 0.02
# ...and from rest: the card left idle for STEADY_REST_S before that warm-up, since the power
# limiter's state carries over for seconds and the warm-up alone leaves a timing dependent on what
# ran before it. Timing two tiles of 14 keys four times each (ABBAABBA) at 512 and 1024 rows, the
# timings of one tile spread by a median of 5.2% (at most 34%) while the card heats up to its
# 700 W cap, 1.8% hot with no rest, and 1.1% (at most 3.0%) after a second's rest before each.
STEADY_REST_S = 1.0


def steady_rest_s(bucket: int) -> float:
    """The idle seconds a steady timing at this row bucket starts from (the tuner's sweep, and
    bench_gemm.py alike): STEADY_REST_S from STEADY_FROM_BUCKET, else none."""
    return STEADY_REST_S if bucket >= STEADY_FROM_BUCKET else 0.0


def steady_replay_ms(graph, n: int, reps: int, warm_ms: float = 0.0, warm_from_ms: float = 0.0,
                     rest_s: float = 0.0) -> float:
    """Median per-call time of `reps` replays of a captured graph of n calls; with warm_ms, where a
    call takes warm_from_ms or more (the first replay, the probe, tells), the graph first replayed
    back to back for warm_ms: after rest_s idle seconds where given (the probe then does not count
    towards the warm-up), else counting the probe."""
    if warm_ms > 0:
        spent = replay_ms(graph)
        if spent / n >= warm_from_ms:
            if rest_s > 0:   # replay_ms synchronized: the card is idle from here
                time.sleep(rest_s)
                spent = 0.0
            while spent < warm_ms:
                spent += replay_ms(graph)
    return statistics.median(replay_ms(graph) / n for _ in range(reps))


def release_captures(first_mark) -> None:
    """After the last replay of graphs captured from first_mark on (capture_graph's third value; the
    caller has dropped them): the device synchronized, and the tile counters their fixup launches
    took (kernels/common.py tile_counters) back to the pool for the next capture."""
    torch.cuda.synchronize()
    common.rewind_capture_counters(first_mark)


def cuda_graph_timer(fn: Callable[[], Any], target_ms: float = 2.0, reps: int = 7, warm_ms: float = 0.0,
                     warm_from_ms: float = 0.0, rest_s: float = 0.0) -> float:
    """Median per-call time of a CUDA graph holding n back-to-back calls (n sized to ~target_ms),
    timed by steady_replay_ms (warm_ms, warm_from_ms, rest_s)."""
    graph, n, mark = capture_graph(fn, target_ms)
    try:
        return steady_replay_ms(graph, n, reps, warm_ms, warm_from_ms, rest_s)
    finally:
        del graph
        release_captures(mark)


def default_timer(device: torch.device, graph: bool, bucket: int) -> tuple[Timer, bool]:
    """(timer, whether it replays CUDA graphs) for a sweep on `device` at a row bucket: graphs on
    CUDA where asked, in steady state from rest from STEADY_FROM_BUCKET rows; eager elsewhere."""
    if device.type == "cuda":
        if not graph:
            return eager_timer, False
        if bucket >= STEADY_FROM_BUCKET:
            return functools.partial(cuda_graph_timer, warm_ms=STEADY_WARM_MS, warm_from_ms=STEADY_MIN_CALL_MS,
                                     rest_s=steady_rest_s(bucket)), True
        return cuda_graph_timer, True
    return eager_timer, False


def _weight_copies(weight, device: torch.device, l2_bytes: int = 120 << 20, most: int = 8) -> list:
    """Copies of the weight to rotate through while timing, so a layer that fits in L2 is not
    timed from L2 (BENCHMARKS.md method). One copy on CPU."""
    if device.type != "cuda":
        return [weight]
    nbytes = max(1, int(weight.nbytes()) if hasattr(weight, "nbytes") else 1)
    k = max(1, min(most, math.ceil(l2_bytes / nbytes)))
    return [weight] + [copy.deepcopy(weight) for _ in range(k - 1)]


# --- checking ------------------------------------------------------------------------------

def check_output(y: torch.Tensor, ref: torch.Tensor, out_dtype: torch.dtype,
                 tolerance: tuple[float, float] | None = None) -> str | None:
    """None when y matches the reference; else a short reason."""
    if tuple(y.shape) != tuple(ref.shape):
        return f"shape {tuple(y.shape)} != reference {tuple(ref.shape)}"
    if y.dtype != out_dtype:
        return f"dtype {y.dtype} != {out_dtype}"
    yf, rf = y.float(), ref.float()
    finite = torch.isfinite(rf)
    if not torch.equal(torch.isfinite(yf), finite):
        return "non-finite outputs where the reference is finite (or the reverse)"
    rtol, atol_frac = tolerance or TOLERANCES.get(out_dtype, TOLERANCES[torch.bfloat16])
    scale = rf[finite].abs().max().item() if finite.any() else 0.0
    err = (yf - rf).abs()[finite]
    bound = (atol_frac * scale + rtol * rf.abs())[finite]
    bad = err > bound
    if bad.any():
        return (f"{int(bad.sum())} of {err.numel()} outputs off the reference "
                f"(max error {err.max().item():.3g}, max |ref| {scale:.3g}, rtol {rtol}, atol {atol_frac}*max|ref|)")
    return None


def same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise equality (NaN payloads and signed zeros included), for any dtype."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


# --- the sweep -----------------------------------------------------------------------------

def sweep(template, weight, x: torch.Tensor, tiles: list[dict] | None = None, *,
          graph: bool = True, timer: Timer | None = None, jobs: int | None = None, problem=None,
          tolerance: tuple[float, float] | None = None, deadline: float | None = None,
          progress: Callable[[int, int, dict], None] | None = None, timed: bool = True) -> list[dict]:
    """Time every candidate tile of `template` for `weight` and activations `x` [M, K]; best first.

    tiles: candidates (default: template.search_space(problem), default tile first).
    timer: fn -> ms (default: CUDA-graph median on a GPU, eager median elsewhere); tests inject fakes.
    jobs: compile threads (default 8 on a GPU; 1 under the interpreter, which is not thread-safe).
    deadline: time.monotonic() after which untimed candidates are skipped (a time budget).
    timed: False checks candidates (compile, reference, determinism) without timing them (verify).
    """
    if x.dim() != 2:
        raise ValueError(f"sweep needs x as [M, K], got shape {tuple(x.shape)}")
    M = x.shape[0]
    if problem is None:
        problem = template.problem(weight, bucket_for(M), x.dtype)
    cands = list(tiles) if tiles is not None else list(template.search_space(problem))
    if not cands:
        raise ValueError(f"template {template.name} offers no candidate tiles for N={problem.N} K={problem.K} "
                         f"bucket={problem.bucket}")
    seen: set[str] = set()
    results: list[dict] = []
    for i, t in enumerate(cands):
        tj = tile_json(t)
        if tj in seen:
            continue
        seen.add(tj)
        results.append({"tile": dict(t), "ms": None, "ok": False, "error": None, "index": i, "graph": False})

    device = x.device
    smem = common.device_features(device).shared_memory
    for r in results:
        r["error"] = prune_reason(r["tile"], weight, x, smem)
    live = [r for r in results if r["error"] is None]

    # Compile (first launch) in parallel. A failure in a thread is retried once alone, so a
    # race inside the JIT can never reject a good tile; a second failure is a real rejection.
    if jobs is None:
        jobs = 8 if device.type == "cuda" else 1

    def warm(r: dict) -> None:
        try:
            if device.type == "cuda" and device.index is not None:  # compile threads: x's device
                torch.cuda.set_device(device)
            template.launch(x, weight, r["tile"])
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            r["error"] = None
        except Exception as e:  # compile failure / out of resources: a rejected candidate
            r["error"] = f"compile/launch failed: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"

    if jobs > 1 and len(live) > 1:
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            list(pool.map(warm, live))
        for r in live:
            if r["error"] is not None:
                warm(r)
    else:
        for r in live:
            warm(r)
    live = [r for r in live if r["error"] is None]

    ref = template.reference(x, weight)
    run_timer, use_graph = (timer, graph) if timer is not None else default_timer(device, graph, problem.bucket)
    copies = _weight_copies(weight, device) if timer is None else [weight]
    total = len(results)
    done = total - len(live)
    bound = tolerance or tolerance_for(problem, x.dtype)
    for r in live:
        tile = r["tile"]
        if deadline is not None and time.monotonic() > deadline:
            r["error"] = "skipped: time budget spent"
            continue
        # Every candidate is checked before it may win: there is no unchecked mode.
        y1 = template.launch(x, weight, tile)
        reason = check_output(y1, ref, x.dtype, bound)
        if reason is None:
            y2 = template.launch(x, weight, tile)
            if not same_bytes(y1, y2):
                reason = "two runs of the same tile gave different bytes (non-deterministic)"
        if reason is not None:
            r["error"] = f"reference check failed: {reason}"
            done += 1
            if progress:
                progress(done, total, tile)
            continue
        if not timed:
            r["ok"] = True
            done += 1
            if progress:
                progress(done, total, tile)
            continue
        state = {"i": 0}

        def call(tile=tile, state=state):
            w = copies[state["i"] % len(copies)]
            state["i"] += 1
            return template.launch(x, w, tile)

        try:
            _count_timing()
            r["ms"] = float(run_timer(call))
            r["graph"] = use_graph
        except Exception as e:
            if use_graph and timer is None:
                # An uncapturable launcher (host sync, allocation pattern), or a graph whose replays
                # failed: time it eagerly and say so, with what failed.
                warnings.warn(f"{template.name} tile {tile_json(tile)}: timing in a CUDA graph failed "
                              f"({type(e).__name__}: {e}); timed eagerly", stacklevel=2)
                torch.cuda.synchronize()
                r["ms"] = float(eager_timer(call))
                r["graph"] = False
            else:
                r["error"] = f"timing failed: {type(e).__name__}: {e}"
        if r["ms"] is not None:
            if not math.isfinite(r["ms"]) or r["ms"] < 0:
                r["error"], r["ms"] = f"timing failed: timer returned {r['ms']}", None
            else:
                r["ok"] = True
        done += 1
        if progress:
            progress(done, total, tile)
    return rank(results)


def rank(results: list[dict]) -> list[dict]:
    """Best first: the earliest candidate within TIE_FRACTION of the fastest, then the rest by
    (ms, index), then rejected candidates in search-space order. Deterministic for equal inputs."""
    ok = [r for r in results if r["ok"] and r["ms"] is not None]
    if not ok:  # untimed sweeps (verify): passing candidates in search-space order
        ok_untimed = sorted((r for r in results if r["ok"]), key=lambda r: r["index"])
        return ok_untimed + sorted((r for r in results if not r["ok"]), key=lambda r: r["index"])
    bad = sorted((r for r in results if not r["ok"]), key=lambda r: r["index"])
    best_ms = min(r["ms"] for r in ok)
    winner = min((r for r in ok if r["ms"] <= best_ms * (1 + TIE_FRACTION)), key=lambda r: r["index"])
    rest = sorted((r for r in ok if r is not winner), key=lambda r: (r["ms"], r["index"]))
    return [winner] + rest + bad


def best_tile(results: list[dict]) -> dict:
    """The winning tile of a sweep, or a ValueError listing why every candidate was rejected."""
    if results and results[0]["ok"]:
        return results[0]["tile"]
    reasons = "; ".join(f"{tile_json(r['tile'])}: {r['error']}" for r in results[:6])
    raise ValueError(f"no candidate tile passed ({len(results)} tried): {reasons}")
