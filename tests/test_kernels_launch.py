"""What every template's launch shares: identical bytes for one tile, refusals, the in-kernel fixup
and its tile counters (eager and under CUDA-graph capture), and launches that never consult the tile
spaces; conventions: tests/kernel_cases.py.
"""
from __future__ import annotations

import dataclasses
import types

import pytest
import torch

from vsr.autotune.buckets import bucket_for
from vsr.autotune.tuner import candidates
from vsr.kernels import common, dense, fp8, gemm, gemm_tiles, int4, nvfp4
from vsr.kernels.template import Problem
from kernel_cases import (
    DEV, K, N, TILED, gen, FP8_GPU_TOL, assert_close, run, TMA, SWAP, SLICES, fp8_weight, int4_weight,
    nvfp4_weight, KernelSpy,
)


# --- shared behaviour ----------------------------------------------------------------------

def test_same_tile_twice_gives_identical_bytes():
    g = gen(11)
    w = int4_weight(g, 64, False, False, bias=True)
    x = torch.randn(5, K, generator=g).half().to(DEV)
    tile = dict(int4.default_tile(int4.problem(w, 8, torch.float16)), SPLIT_K=4)
    a = int4.launch(x, w, tile)
    b = int4.launch(x, w, tile)
    assert torch.equal(a.view(torch.int16), b.view(torch.int16))


def test_launch_refuses_wrong_shapes_and_dtypes():
    g = gen(12)
    w = dense.DenseWeight(torch.randn(N, K, generator=g).half()).to(DEV)
    tile = dense.default_tile(dense.problem(w, 1, torch.float16))
    with pytest.raises(AssertionError, match="K=256"):
        dense.launch(torch.randn(1, K + 1).half().to(DEV), w, tile)
    with pytest.raises(AssertionError, match="one dtype"):
        dense.launch(torch.randn(1, K).float().to(DEV), w, tile)
    with pytest.raises(ValueError, match="lacks BLOCK_K"):
        dense.launch(torch.randn(1, K).half().to(DEV), w, {k: v for k, v in tile.items() if k != "BLOCK_K"})


@pytest.mark.parametrize("path", ["tma", "tma-sk", "tma-swap"])
def test_dense_tma_paths_take_no_rows(path):
    # M=0 (an empty batch reaching a launcher directly): an empty output, nothing launched.
    g = gen(34)
    w = dense.DenseWeight(torch.randn(N, K, generator=g).half()).to(DEV)
    y = dense.launch(torch.empty(0, K, dtype=torch.float16, device=DEV), w, dict(TMA, path=path))
    assert y.shape == (0, N)


# --- the in-kernel fixup (tile field FIXUP) ---------------------------------------------------
def _fixup_cases():
    """(name, launch, reference, x, weight, tile, programs): split-K and stream-K launches of every
    template that adds its splits' partials in the kernel when asked. programs: the multiprocessors
    stream-K shares out over (None: not stream-K)."""
    g = gen(140)
    dw = dense.DenseWeight(torch.randn(N, K + 64, generator=g).half(), torch.randn(N, generator=g).half()).to(DEV)
    dw32 = dense.DenseWeight(torch.randn(N, K, generator=g), None).to(DEV)
    fw = fp8_weight(g, torch.float16, True)
    iw = int4_weight(g, 128, False, True, True, torch.float16, Kx=300)
    iws = int4_weight(g, 64, True, False, True)
    iw128 = int4_weight(g, 128, True, False, False)
    x = {M: torch.randn(M, K, generator=g).half().to(DEV) for M in (1, 5, 20, 40, 70)}
    x320 = {M: torch.randn(M, K + 64, generator=g).half().to(DEV) for M in (5, 40)}
    x300 = torch.randn(40, 300, generator=g).half().to(DEV)
    x32 = torch.randn(33, K, generator=g).to(DEV)
    dwk = dense.DenseWeight(dw.weight[:, :K].contiguous(), dw.bias)
    return [
        ("dense tiled, 3 splits (the last short)", dense.launch, dense.reference_linear, x320[40], dw,
         dict(TILED, SPLIT_K=3), None),
        ("dense tma-swap, 3 splits, three row blocks", dense.launch, dense.reference_linear, x320[40], dw,
         dict(SWAP, SPLIT_K=3), None),
        ("dense tma-swap fp32, 2 splits", dense.launch, dense.reference_linear, x32, dw32,
         dict(SWAP, BLOCK_M=32, BLOCK_K=32, SPLIT_K=2), None),
        ("fp8 tma-swap, 2 splits", fp8.launch, fp8.reference_linear, x[1], fw, dict(SWAP, BLOCK_K=128, SPLIT_K=2),
         None),
        ("int4 swap, 3 splits", int4.launch, int4.reference_linear, x[5], iws,
         dict(TILED, path="swap", BLOCK_M=16, BLOCK_K=32, SPLIT_K=3), None),
        ("int4 tiled, 2 splits", int4.launch, int4.reference_linear, x[40], iws, dict(TILED, SPLIT_K=2), None),
        ("int4 slices, 2 splits, two row blocks", int4.launch, int4.reference_linear, x[70], iw128,
         dict(SLICES, BLOCK_M=64, SPLIT_K=2), None),
        ("int4 join, 3 splits, K=300, act order", int4.launch, int4.reference_linear, x300, iw,
         dict(SLICES, path="join", BLOCK_M=64, SPLIT_K=3), None),
        ("dense tma-sk, 1 of 4 tiles left over", dense.launch, dense.reference_linear, x[40], dwk,
         dict(TMA, path="tma-sk"), 3),
        ("dense tma-sk, all tiles shared, 20 live rows", dense.launch, dense.reference_linear, x[20],
         dataclasses.replace(dwk, bias=None), dict(TMA, path="tma-sk"), 64),
        ("fp8 tma-sk, 2 of 6 tiles left over", fp8.launch, fp8.reference_linear, x[70], fw,
         dict(TMA, BLOCK_K=128, path="tma-sk"), 4),
    ]


def _spy_on_reductions(monkeypatch) -> list:
    """The reduction kernels (split-K's and stream-K's) launched from now on, run and recorded as
    KernelSpy records them."""
    calls = []
    for module, kern in ((common, "splitk_reduce_kernel"), (gemm, "streamk_reduce_kernel")):
        monkeypatch.setattr(module, kern, KernelSpy(calls, kern, real=getattr(module, kern)))
    return calls


@pytest.mark.parametrize("case", range(11))
def test_in_kernel_fixup_gives_the_reductions_bytes(case, monkeypatch):
    # The last split (or stream-K program) of each tile to finish adds the partials in the same
    # order as the reduction kernel would: the same bytes, not just close ones, with no reduction
    # kernel launched; and every tile counter is back at zero for the next launch.
    name, launch, reference, x, w, tile, programs = _fixup_cases()[case]
    if programs is not None:
        monkeypatch.setattr(gemm, "multiprocessors", lambda device: programs)
    launched = _spy_on_reductions(monkeypatch)
    monkeypatch.setattr(common, "_COUNTERS", {})
    fixed = run(launch, x, w, dict(tile, FIXUP=1))
    assert launched == [] and common._COUNTERS, f"{name}: the fixup did not run"
    assert_close(fixed, reference(x, w))
    assert torch.equal(fixed, run(launch, x, w, dict(tile, FIXUP=0))), name
    assert len(launched) == 1, f"{name}: without FIXUP the reduction kernel runs"
    assert torch.equal(fixed, run(launch, x, w, dict(tile, FIXUP=1))), name
    assert all(int(c.abs().sum()) == 0 for c in common._COUNTERS.values()), "a tile counter was left non-zero"


def test_tile_counters_are_per_stream_and_grow_zeroed():
    dev = torch.device(DEV)
    c = common.tile_counters(dev, 10)
    assert c.dtype == torch.int32 and c.numel() >= 10 and int(c.abs().sum()) == 0
    assert common.tile_counters(dev, 10) is c
    big = common.tile_counters(dev, 5000)
    assert big.numel() >= 5000 and int(big.abs().sum()) == 0
    if DEV == "cuda":   # another stream, another buffer: its launches may overlap this one's
        with torch.cuda.stream(torch.cuda.Stream()):
            assert common.tile_counters(dev, 10) is not big


@pytest.mark.filterwarnings("ignore:The CUDA Graph is empty")   # the capture launches no kernel
def test_outgrown_counters_are_kept_and_captures_get_their_own():
    # A buffer outgrown is kept alive (a graph captured with it still points at it); under CUDA
    # graph capture every launch takes zeroed counters of its own (a capture-pool slice, or its
    # own buffer), so graphs never share them.
    dev = torch.device(DEV)
    small = common.tile_counters(dev, 1)
    big = common.tile_counters(dev, 2 * small.numel())
    assert big is not small and any(r is small for r in common._RETIRED)
    if DEV == "cuda":
        with torch.cuda.graph(torch.cuda.CUDAGraph()):
            a, b = common.tile_counters(dev, 10), common.tile_counters(dev, 10)
        assert a is not b and a.data_ptr() != big.data_ptr()


def test_capture_pool_hands_each_zeroed_slice_to_one_captured_launch(monkeypatch):
    # The pool's bookkeeping, on whatever device (the capture itself needs a GPU: the GPU test
    # below): disjoint zeroed slices; a launch the pool cannot serve gets its own zeroed buffer;
    # a new pool once less than half is left (the old kept), at most CAPTURE_POOLS_MAX; and a
    # rewind to a mark of the current pool hands the same counters out again, one of an older
    # pool nothing.
    dev = torch.device("cpu")
    synced = []
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: types.SimpleNamespace(
        synchronize=lambda: synced.append(device)))
    monkeypatch.setattr(common, "_CAPTURE_POOLS", {})
    monkeypatch.setattr(common, "_RETIRED", [])
    monkeypatch.setattr(common, "CAPTURE_POOL_COUNTERS", 8)
    monkeypatch.setattr(common, "CAPTURE_POOLS_MAX", 2)
    assert common.capture_counters_mark() == {}
    assert common._captured_counters(dev, 3).numel() == 3      # no pool yet: its own buffer
    common._refill_capture_pool(dev)
    pool = common._CAPTURE_POOLS[dev][0]
    assert synced == [dev] and pool.numel() == 8
    mark = common.capture_counters_mark()
    a, b = common._captured_counters(dev, 3), common._captured_counters(dev, 3)
    assert (a.data_ptr(), b.data_ptr()) == (pool.data_ptr(), pool.data_ptr() + 12)
    assert not a.any() and not b.any()
    c = common._captured_counters(dev, 3)                      # 2 left: its own buffer
    assert c.numel() == 3 and not c.any() and c.untyped_storage().data_ptr() != pool.untyped_storage().data_ptr()
    common.rewind_capture_counters(mark)
    assert common._captured_counters(dev, 3).data_ptr() == pool.data_ptr()
    common._captured_counters(dev, 3)
    common._refill_capture_pool(dev)                           # 2 of 8 left: a second pool
    second = common._CAPTURE_POOLS[dev][0]
    assert second is not pool and common._RETIRED == [pool] and len(synced) == 2
    assert common._captured_counters(dev, 3).data_ptr() == second.data_ptr()
    common.rewind_capture_counters(mark)                       # a mark of the old pool: nothing
    assert common._CAPTURE_POOLS[dev][1] == 3
    common._captured_counters(dev, 5)
    common._refill_capture_pool(dev)                           # the second of at most two: kept
    assert common._CAPTURE_POOLS[dev][0] is second and common._captured_counters(dev, 1).data_ptr() != second.data_ptr()


@pytest.mark.skipif(DEV != "cuda", reason="CUDA graphs need a GPU")
def test_captured_fixup_launches_replay_with_their_own_counters(monkeypatch):
    # Three graphs of fixup launches (split-K and stream-K), replayed one after another and at
    # once on three streams: the eager bytes each time, their counters from the pool (no zeroing
    # node) and left at zero.
    cases = [c for c in _fixup_cases() if c[0].startswith(("dense tiled", "int4 join", "fp8 tma-sk"))]
    assert len(cases) == 3, [c[0] for c in _fixup_cases()]
    eager, graphs, outs = [], [], []
    for name, launch, reference, x, w, tile, programs in cases:
        if programs is not None:   # stream-K: fewer programs than tiles, so some are shared
            monkeypatch.setattr(gemm, "multiprocessors", lambda device, p=programs: p)
        tile = dict(tile, FIXUP=1)
        eager.append(launch(x, w, tile))           # also makes the capture pool
        torch.cuda.synchronize()
        start = common._CAPTURE_POOLS[x.device][1]
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            outs.append(launch(x, w, tile))
        assert common._CAPTURE_POOLS[x.device][1] > start, f"{name}: counters not from the pool"
        graphs.append(g)
    for _ in range(3):
        for g in graphs:
            g.replay()
        torch.cuda.synchronize()
        assert all(torch.equal(o, e) for o, e in zip(outs, eager))
    for o in outs:
        o.fill_(float("nan"))
    streams = [torch.cuda.Stream() for _ in graphs]
    for s, g in zip(streams, graphs):
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            g.replay()
    torch.cuda.synchronize()
    assert all(torch.equal(o, e) for o, e in zip(outs, eager))
    pool = common._CAPTURE_POOLS[cases[0][3].device]
    assert int(pool[0][:pool[1]].abs().sum()) == 0, "a captured launch left a counter non-zero"
    # The tuner's graph timer takes its graph's counters from the pool and hands them back once
    # the graph is gone.
    from vsr.autotune.tuner import cuda_graph_timer
    name, launch, reference, x, w, tile, programs = cases[0]
    used, seen = pool[1], []

    def call():
        launch(x, w, dict(tile, FIXUP=1))
        if torch.cuda.is_current_stream_capturing():
            seen.append(common._CAPTURE_POOLS[x.device][1])
    assert cuda_graph_timer(call, target_ms=0.1, reps=2) > 0
    assert seen and seen[0] > used, "the timer's captured launches did not take pool counters"
    assert common._CAPTURE_POOLS[x.device] is pool and pool[1] == used and int(pool[0].abs().sum()) == 0


def test_int4_gemv_refuses_the_fixup():
    # A tile field a path cannot honour is refused, not ignored.
    g = gen(142)
    w = int4_weight(g, 128, True, False, bias=False)
    x = torch.randn(1, K, generator=g).half().to(DEV)
    tile = {"path": "gemv", "BLOCK_M": 1, "BLOCK_N": 16, "BLOCK_K": 64, "SPLIT_K": 2, "num_warps": 4,
            "num_stages": 2, "FIXUP": 1}
    with pytest.raises(ValueError, match="no in-kernel fixup"):
        int4.launch(x, w, tile)
    assert_close(run(int4.launch, x, w, dict(tile, FIXUP=0)), int4.reference_linear(x, w))


@pytest.mark.parametrize("bucket", tuple(gemm_tiles.WIDE_SPLITS))
def test_every_wide_tile_is_in_the_tuners_pick_of_16(bucket):
    # caches/retune.sh tunes bf16 and fp8 with 16 candidates: the pick gives wide tiles a share per
    # BLOCK_M (gemm_tiles.pick_group), so none of the few the space keeps
    # goes untimed on the 27B-class shapes.
    for N, K in ((10240, 5120), (5120, 8192), (34816, 5120), (5120, 17408)):
        for t in (dense, fp8):
            space = t.search_space(Problem(N=N, K=K, bucket=bucket, act_dtype=torch.bfloat16, params=()))
            wide = [c for c in space if c.get("BLOCK_N2")]
            assert len(wide) == len(gemm_tiles.WIDE_SPLITS[bucket]), (t.__name__, N, K, bucket)
            pick = candidates(space, 16, t.TEMPLATE.pick_group)
            assert all(c in pick for c in wide), (t.__name__, N, K, bucket)
            # and bucket 256's stream-K tiles of 256 rows (gemm_tiles.pick_group: a group of their own)
            tall = [c for c in space if c["path"] == "tma-sk" and c["BLOCK_M"] == 256]
            assert len(tall) == (len(gemm_tiles.TALL_SK_256) if bucket == 256 else 0), (t.__name__, N, K, bucket)
            assert all(c in pick for c in tall), (t.__name__, N, K, bucket)


def test_launches_never_call_the_tile_spaces(monkeypatch):
    # gemm_tiles.py and int4_tiles.py are outside every source hash (template.TILE_CHOICE_MODULES):
    # they may only choose tiles. Each template's launch of a tile of every path of its spaces
    # (chosen first) must then run, and match its reference, with every function of both disabled.
    import types as _types
    from vsr.kernels import int4_tiles
    from vsr.kernels.template import TILE_CHOICE_MODULES
    assert TILE_CHOICE_MODULES == {gemm_tiles.__name__, int4_tiles.__name__}
    g = gen(77)
    cases = [(dense, dense.launch, dense.DenseWeight(torch.randn(N, K, generator=g).half(),
                                                     torch.randn(N, generator=g).half()).to(DEV), None),
             (fp8, fp8.launch, fp8_weight(g, torch.float16, True), FP8_GPU_TOL if DEV == "cuda" else None),
             (int4, int4.launch, int4_weight(g, 128, False, True, True), None),
             (nvfp4, nvfp4.launch_emulated, nvfp4_weight(g, True, True, torch.float16), None)]
    runs = []
    hopper = DEV == "cuda" and torch.cuda.get_device_capability() == (9, 0)
    for mod, launch, w, tol in cases:
        problem = nvfp4.problem if mod is nvfp4 else mod.problem
        space_of = nvfp4.search_space if mod is nvfp4 else mod.search_space
        for M in (1, 5, 40, 200):
            seen = set()
            for t in space_of(problem(w, bucket_for(M), torch.float16)):
                form = (t["path"], bool(t.get("BLOCK_N2")), bool(t.get("PERSISTENT")))
                if t["path"] == "wgmma" and not hopper:   # Hopper's only (the GPU test runs it there)
                    continue
                if form not in seen:
                    seen.add(form)
                    runs.append((mod, launch, w, tol, M, t))
    for mod in (gemm_tiles, int4_tiles):
        for name, f in vars(mod).items():
            if isinstance(f, _types.FunctionType) and f.__module__ == mod.__name__:
                monkeypatch.setattr(mod, name, lambda *a, _n=f"{mod.__name__}.{name}", **k: pytest.fail(f"a launch called {_n}"))
    for mod, launch, w, tol, M, t in runs:
        x = torch.randn(M, K, generator=g).half().to(DEV)
        assert_close(run(launch, x, w, t), mod.reference_linear(x, w), tol)
    assert len({(r[0].__name__, r[5]["path"]) for r in runs}) >= 12
