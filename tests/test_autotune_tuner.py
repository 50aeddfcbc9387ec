"""The tuner: a wrong tile never wins, ties are deterministic, pruning and compile failures reject."""
import pytest
import torch

from vsr.autotune import tuner
from vsr.autotune.fake import BROKEN_BLOCK_K, FAKE_DENSE
from vsr.autotune.keys import CacheKey, make_key
from vsr.autotune.device_id import DeviceIdentity
from vsr.kernels.dense import DenseWeight


def _wx(M=5, N=48, K=96, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    w = DenseWeight(torch.randn(N, K, generator=g).to(dtype), torch.randn(N, generator=g).to(dtype))
    x = torch.randn(M, K, generator=g).to(dtype)
    return w, x


def test_wrong_tile_never_wins_even_when_fastest():
    w, x = _wx()
    # The fake timer calls the launcher (as a real timer would) and makes the broken tile the fastest.
    def timer(fn):
        fn()
        return 0.001 if fn.__defaults__[0]["BLOCK_K"] == BROKEN_BLOCK_K else 1.0 / fn.__defaults__[0]["BLOCK_K"]
    res = tuner.sweep(FAKE_DENSE, w, x, timer=timer)
    assert res[0]["ok"] and res[0]["tile"]["BLOCK_K"] == 64
    broken = [r for r in res if r["tile"]["BLOCK_K"] == BROKEN_BLOCK_K]
    assert broken and all(not r["ok"] and "reference check failed" in r["error"] for r in broken)
    assert [r["ok"] for r in res] == sorted((r["ok"] for r in res), reverse=True)  # rejected last
    oks = [r["ms"] for r in res if r["ok"]]
    assert oks == sorted(oks)


def test_ties_go_to_the_earliest_candidate_and_reruns_agree():
    w, x = _wx(dtype=torch.float16)
    timer = lambda fn: 1.0  # noqa: E731  every tile equally fast
    a = tuner.sweep(FAKE_DENSE, w, x, timer=timer)
    b = tuner.sweep(FAKE_DENSE, w, x, timer=timer)
    assert a[0]["index"] == 0 and a[0]["tile"] == FAKE_DENSE.default_tile(FAKE_DENSE.problem(w, 8, x.dtype))
    assert [r["tile"] for r in a] == [r["tile"] for r in b]
    # within 1% is a tie; 2% faster is not
    ms = {0: 1.0, 1: 0.995, 2: 0.98}
    cands = FAKE_DENSE.search_space(FAKE_DENSE.problem(w, 8, x.dtype))
    timer2 = lambda fn: ms.get(cands.index(fn.__defaults__[0]), 1.0)  # noqa: E731
    res = tuner.sweep(FAKE_DENSE, w, x, tiles=cands, timer=timer2)
    assert res[0]["index"] == 2


def test_timing_counter_and_time_budget():
    w, x = _wx()
    before = tuner.timing_calls()
    res = tuner.sweep(FAKE_DENSE, w, x, timer=lambda fn: 1.0)
    timed = sum(r["ms"] is not None for r in res)
    assert tuner.timing_calls() - before == timed > 0
    res = tuner.sweep(FAKE_DENSE, w, x, timer=lambda fn: 1.0, deadline=0.0)
    # the budget is checked before each candidate's reference check: every candidate is skipped, none judged
    assert not any(r["ok"] for r in res) and all("time budget" in r["error"] for r in res)
    assert all(r["ms"] is None for r in res)
    with pytest.raises(ValueError, match="no candidate tile passed"):
        tuner.best_tile(res)


def test_pruning_and_compile_failures_reject_without_crashing():
    w, x = _wx()
    huge = {"BLOCK_M": 256, "BLOCK_N": 256, "BLOCK_K": 256, "num_warps": 4, "num_stages": 4}
    assert "shared memory" in tuner.prune_reason(huge, w, x, smem_limit=228 * 1024)
    assert "registers" in tuner.prune_reason({**huge, "BLOCK_K": 16, "num_stages": 1}, w, x, smem_limit=None)
    assert tuner.prune_reason({"path": "gemv"}, w, x, 1000) is None  # unknown layout: left to the compiler
    bad = {"BLOCK_M": 16, "BLOCK_N": 32, "num_warps": 4}  # no BLOCK_K: the launcher raises KeyError
    good = FAKE_DENSE.search_space(FAKE_DENSE.problem(w, 8, x.dtype))[0]
    res = tuner.sweep(FAKE_DENSE, w, x, tiles=[bad, good], timer=lambda fn: 1.0)
    assert res[0]["tile"] == good and res[0]["ok"]
    assert "compile/launch failed" in res[1]["error"]


def test_check_output_catches_unwritten_and_wrong_outputs():
    w, x = _wx(dtype=torch.float16)
    ref = FAKE_DENSE.reference(x, w)
    assert tuner.check_output(ref.clone(), ref, torch.float16) is None
    y = ref.clone()
    y[0, 0] = float("nan")
    assert "non-finite" in tuner.check_output(y, ref, torch.float16)
    y = ref.clone()
    y[1, 3] += 0.5 * ref.abs().max()
    assert "1 of" in tuner.check_output(y, ref, torch.float16)
    assert "dtype" in tuner.check_output(ref.float(), ref, torch.float16)


def test_key_differs_in_every_field_and_round_trips():
    w, x = _wx()
    p = FAKE_DENSE.problem(w, 8, x.dtype)
    ident = DeviceIdentity("nvidia", "NVIDIA H200", (9, 0), None, 132)
    k = make_key(FAKE_DENSE, p, ident, triton="3.6.0")
    assert CacheKey.from_canonical(k.canonical()) == k
    others = [
        make_key(FAKE_DENSE, p, DeviceIdentity("nvidia", "NVIDIA H200", (9, 0), None, 78), triton="3.6.0"),
        make_key(FAKE_DENSE, p, DeviceIdentity("nvidia", "NVIDIA H100", (9, 0), None, 132), triton="3.6.0"),
        make_key(FAKE_DENSE, p, ident, triton="3.7.0"),
        make_key(FAKE_DENSE, FAKE_DENSE.problem(w, 16, x.dtype), ident, triton="3.6.0"),
        make_key(FAKE_DENSE, FAKE_DENSE.problem(w, 8, torch.float16), ident, triton="3.6.0"),
        make_key(FAKE_DENSE, FAKE_DENSE.problem(DenseWeight(w.weight.half()), 8, x.dtype), ident, triton="3.6.0"),
    ]
    assert len({o.digest() for o in others} | {k.digest()}) == len(others) + 1


def test_fp8_problems_are_checked_at_the_fp8_operand_bound_at_least():
    import torch
    from vsr.kernels import fp8
    from vsr.kernels.template import Problem

    w = fp8.Fp8Weight(torch.randn(8, 32).to(fp8.FP8_DTYPE), torch.rand(8) + 0.5)
    p32 = Problem(N=8, K=32, bucket=4, act_dtype=torch.float32, params=w.params())
    assert tuner.tolerance_for(p32, torch.float32) == tuner.FP8_OPERAND_TOLERANCE
    # bf16 outputs keep their own, looser bound; a dense fp32 problem keeps the fp32 bound.
    assert tuner.tolerance_for(p32, torch.bfloat16) == tuner.TOLERANCES[torch.bfloat16]
    dense32 = Problem(N=8, K=32, bucket=4, act_dtype=torch.float32, params=(("wdtype", "float32"),))
    assert tuner.tolerance_for(dense32, torch.float32) == tuner.TOLERANCES[torch.float32]
    # An fp8-level error passes for the fp8 problem and fails the plain fp32 bound.
    ref = torch.randn(4, 8)
    y = ref + 1e-3 * ref.abs().max()
    assert tuner.check_output(y, ref, torch.float32, tuner.tolerance_for(p32, torch.float32)) is None
    assert tuner.check_output(y, ref, torch.float32) is not None


def test_candidates_keep_the_default_and_spread_over_the_space():
    from vsr.autotune.tuner import candidates
    space = list(range(50))
    pick = candidates(space, 12)
    assert len(pick) == 12 and pick[0] == 0 and pick == sorted(set(pick))
    assert pick[1] == 1 and pick[-1] == 49          # both ends of the rest are seen, not just its head
    assert candidates(space, None) == space and candidates(space, 80) == space
    assert candidates(space, 1) == [0]
    assert candidates(space, 2) == [0, 49] and candidates(space, 3) == [0, 1, 49]
    # every size below the space's: n tiles, the default first, no repeats, the last tile seen
    for L in range(2, 20):
        space = [f"t{i}" for i in range(L)]
        for n in range(2, L):
            pick = candidates(space, n)
            assert len(pick) == len(set(pick)) == n and pick[0] == "t0" and pick[-1] == space[-1], (L, n, pick)
            assert [space.index(t) for t in pick] == sorted(space.index(t) for t in pick)


def test_incumbents_join_the_pick_only_from_the_space_and_once():
    from vsr.autotune.tuner import candidates, with_incumbents
    space = [{"path": "s", "i": i} for i in range(30)]
    pick = candidates(space, 4)
    missed = next(t for t in space if t not in pick)
    gone = {"path": "s", "i": 99}                   # no longer in the search space: never timed
    out = with_incumbents(pick, space, [pick[1], missed, gone, dict(missed)])
    assert out[:4] == pick and out[4:] == [missed] and len(out) == 5
    assert with_incumbents(pick, space, []) == pick and with_incumbents(space, space, [missed]) == space


def test_candidates_share_the_pick_among_paths():
    # The stratified pick: with n - 1 >= 2 x the paths after the default, every path is seen (an
    # even spread over this space at n=7 would miss the short path "j"), its first and last tile
    # among its share; below that n, the even spread. Then, over random spaces: n tiles (or all),
    # the default first, no repeats, in search-space order, every path seen when stratified.
    import random
    from vsr.autotune.tuner import candidates
    space = [{"path": p, "i": i} for i, p in enumerate("s" * 9 + "j" * 3 + "w" * 8)]

    def ids(sp, n):
        return [t["i"] for t in candidates(sp, n)]
    assert ids(space, 7) == [0, 1, 8, 9, 11, 12, 19]
    assert ids(space, 10) == [0, 1, 5, 8, 9, 10, 11, 12, 16, 19]
    assert ids(space, 6) == [0, 1, 5, 10, 15, 19] and ids(space, 2) == [0, 19] and ids(space, 3) == [0, 1, 19]
    one = [{"path": "a", "i": i} for i in range(10)] + [{"path": "b", "i": 10}]
    assert ids(one, 5) == [0, 1, 5, 9, 10]      # a one-tile path gets its one tile, the other path the rest
    rng = random.Random(0)
    for _ in range(300):
        sp = [{"path": rng.choice("abcd"), "i": i} for i in range(rng.randint(2, 40))]
        for n in range(1, len(sp) + 2):
            pick = ids(sp, n)
            assert len(pick) == min(n, len(sp)) and pick[0] == 0 and pick == sorted(set(pick)), (sp, n, pick)
            paths = {t["path"] for t in sp[1:]}
            if len(paths) > 1 and n - 1 >= 2 * len(paths) and len(sp) > n:
                assert {sp[i]["path"] for i in pick[1:]} == paths, (sp, n, pick)


def test_the_pick_is_shared_among_the_templates_groups(tmp_path):
    # candidates groups tiles by `group` (a template's pick_group), not only by path: a form of two
    # tiles inside a long path gets its share once it is a group. The tuner's resolver passes the
    # template's own hook when it picks (vsr-tune --max-candidates).
    import dataclasses
    from vsr.autotune.resolver import TileResolver
    from vsr.autotune.tuner import candidates
    space = [{"path": "s", "i": i, "form": i in (14, 15)} for i in range(20)]

    def ids(n, group=None):
        return [t["i"] for t in (candidates(space, n, group) if group else candidates(space, n))]
    assert ids(5) == [0, 1, 7, 13, 19]                                            # one path: an even spread
    assert ids(5, lambda t: (t["path"], t["form"])) == [0, 1, 14, 15, 19]         # the form's two tiles
    forms = dataclasses.replace(FAKE_DENSE, pick_group=lambda t: t["BLOCK_N"] == 64)
    w, x = _wx()
    space = forms.search_space(forms.problem(w, 8, x.dtype))
    want = candidates(space, 5, forms.pick_group)
    assert want != candidates(space, 5) and [t["BLOCK_N"] for t in want[1:]] == [32, 64, 32, 64]
    timed = []
    r = TileResolver(tmp_path / "t.db", policy="tune", device="cpu", use_shipped=False,
                     timer=lambda fn: (timed.append(1), fn(), 1.0)[2])
    tile, tuned = r.tune(forms, forms.problem(w, 8, x.dtype), weight=w, x=x, max_candidates=5)
    assert tuned and len(timed) == len(want)
    assert [c["tile"] for c in r.store.get(r.key(forms, forms.problem(w, 8, x.dtype)).digest()).candidates] == want


def test_tall_stream_k_tiles_get_a_share_of_the_pick_of_their_own():
    # Bucket 256's dense space: the 256-row stream-K tiles (3, after five 128-row ones) are a group
    # of their own, served before the long paths in each round, so a 16-tile pick sees them all
    # (not at most one of the path's spread) and every wide tile too; the long paths, plain TMA
    # tiles and pointer loads, keep two tiles each besides the default (their first and last).
    from vsr.autotune.tuner import candidates
    from vsr.kernels import gemm_tiles
    d = gemm_tiles.default_gemm_tile(256, 5120, 17408, 2, 2)
    pick = candidates(gemm_tiles.gemm_space(256, 5120, 17408, 2, 2, d), 16, gemm_tiles.pick_group)
    tall = [(t["BLOCK_N"], t["num_warps"], t["num_stages"]) for t in pick if t["path"] == "tma-sk" and t["BLOCK_M"] == 256]
    assert tall == list(gemm_tiles.TALL_SK_256)
    assert len([t for t in pick if t.get("BLOCK_N2")]) == len(gemm_tiles.WIDE_SPLITS[256])
    assert [len([t for t in pick[1:] if t["path"] == p and not t.get("BLOCK_N2")]) for p in ("tma", "tiled")] == [2, 2]
    assert any(t["path"] == "tma-sk" and t["BLOCK_M"] == 128 for t in pick)


def _int4_pick(symmetric, bucket, field):
    """The 27B qkv int4 key's search space at `bucket`, its 20-tile pick (caches/retune.sh's), and
    the tiles of each carrying the tile field `field`, with their pick groups."""
    import dataclasses
    from vsr.autotune import synth
    from vsr.autotune.tuner import candidates
    from vsr.kernels import registry
    t = registry.TEMPLATES["int4_w4a16"]
    w = synth.random_weight("int4", 64, 256, dict(group=128, symmetric=symmetric), torch.bfloat16)
    space = t.search_space(dataclasses.replace(t.problem(w, bucket, torch.bfloat16), N=10240, K=5120))
    pick = candidates(space, 20, t.pick_group)
    flagged = [c for c in space if c.get(field)]
    return space, pick, flagged, [c for c in pick if c.get(field)], {t.pick_group(c) for c in flagged}


def test_int4_scale_w_join_tiles_get_a_share_of_the_pick_of_their_own():
    # The int4 join's SCALE_W tiles are groups of their own (a kernel form whose products stay in
    # flight, which the fp32-scaled join's do not), those of 256 weight rows apart, and so are the
    # frag and wgmma tiles (their paths): the 20-tile pick of caches/retune.sh sees two of each
    # SCALE_W group's four (the first and last of each), all three frag tiles and the first and last
    # of the twenty-six wgmma tiles at bucket 128 (one of each form: the unpacking warpgroup's, RS with
    # the in-kernel fixup), beside
    # fp32-scaled join tiles. At 256, with more groups than the pick has pairs of tiles for (11),
    # it spreads evenly over the whole space: a SCALE_W group, both wgmma forms and the dequantizing
    # paths are in it.
    from vsr.kernels import int4_tiles
    t = int4_tiles.pick_group
    space, pick, scaled, got, groups = _int4_pick(True, 128, "SCALE_W")
    assert groups == {("join", "scale-w"), ("join", "scale-w-256")} and len(scaled) == 8
    for of, picked in [([c for c in scaled if t(c) == g], [c for c in got if t(c) == g])
                       for g in (("join", "scale-w-256"), ("join", "scale-w"))]:
        assert len(picked) == 2 and picked[0] == of[0] and picked[-1] == of[-1], picked
    frag = [c for c in space if c["path"] == "frag"]
    assert len(frag) == 3 and all(c in pick for c in frag)
    wgmma = [c for c in space if c["path"] == "wgmma"]
    assert len(wgmma) == 26 and [c for c in pick if c["path"] == "wgmma"] == [wgmma[0], wgmma[-1]]
    assert not wgmma[0].get("RS") and wgmma[-1].get("RS") and wgmma[-1].get("FIXUP")
    assert any(c["path"] == "join" and not c.get("SCALE_W") for c in pick)
    space, pick, scaled, got, groups = _int4_pick(True, 256, "SCALE_W")
    assert {t(c) for c in pick} & {("join", "scale-w"), ("join", "scale-w-256")}
    assert {bool(c.get("RS")) for c in pick if c["path"] == "wgmma"} == {True, False}
    assert {c["path"] for c in pick} >= {"dequant", "dequant-tma", "wgmma"}


def test_int4_x_split_tiles_get_a_share_of_the_pick_of_their_own():
    # int4 slices tiles that read x as stored (X_SPLIT; X_ROW at up to two rows) are a
    # group of their own: at bucket 1, where every slices tile comes in that form too, the 20-tile
    # pick of caches/retune.sh sees the default and five more of them beside five copy-form slices
    # tiles; at bucket 2 (every tile in that form after the copying ones) five of them beside the
    # copying default and five more; at bucket 16 the one X_SPLIT tile, beside four copy-form ones
    # (the 256-weight-row join tile's group takes a share there).
    # (At bucket 2 that leaves out X_ROW tiles that can win: caches/retune.sh tunes buckets 2 and 4
    # over their whole spaces before the 20-tile pass.)
    for bucket, seen, copying in ((1, 6, 5), (2, 5, 6), (16, 1, 4)):
        space, pick, _, got, groups = _int4_pick(False, bucket, "X_SPLIT")
        assert groups == {("slices", "x-split")}
        assert len(got) == seen and (bucket > 1 or got[0] == space[0]), (bucket, got)
        assert sum(c["path"] == "slices" and not c.get("X_SPLIT") for c in pick) == copying, bucket


def test_candidates_of_many_rows_are_timed_in_their_own_steady_state():
    # Under compute-bound products the H200 is power-limited and a graph's first
    # 25-50 ms can run up to 17% faster, so from bucket 256 each candidate's graph is replayed for
    # STEADY_WARM_MS before it is timed; fewer rows (memory-bound), and eager timing, stay as they were.
    cuda = torch.device("cuda")
    timer, graph = tuner.default_timer(cuda, True, tuner.STEADY_FROM_BUCKET)
    assert graph and timer.func is tuner.cuda_graph_timer
    assert timer.keywords == {"warm_ms": tuner.STEADY_WARM_MS, "warm_from_ms": tuner.STEADY_MIN_CALL_MS,
                              "rest_s": tuner.STEADY_REST_S}
    assert tuner.default_timer(cuda, True, tuner.STEADY_FROM_BUCKET // 2) == (tuner.cuda_graph_timer, True)
    assert tuner.default_timer(cuda, False, 4096) == (tuner.eager_timer, False)
    assert tuner.default_timer(torch.device("cpu"), True, 4096) == (tuner.eager_timer, False)
    assert tuner.STEADY_FROM_BUCKET == 256 and tuner.STEADY_WARM_MS == 200.0 and tuner.STEADY_REST_S == 1.0


def test_the_graph_timer_warms_only_calls_long_enough_and_gives_them_back_their_counters(monkeypatch):
    # cuda_graph_timer's logic on the CPU, capture and replays faked: a graph of n calls replayed
    # for warm_ms first (the first replay counted) where a call takes warm_from_ms or more, then
    # the median of `reps` replays per call; the graph's counters rewound to its mark after.
    from vsr.autotune import tuner
    replays, rewound = [], []
    monkeypatch.setattr(tuner, "capture_graph", lambda fn, target_ms: ("graph", 4, "mark"))
    monkeypatch.setattr(tuner, "replay_ms", lambda g: replays.append(g) or 2.0 + len(replays) % 3)
    monkeypatch.setattr(tuner.common, "rewind_capture_counters", rewound.append)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    ms = tuner.cuda_graph_timer(lambda: None, reps=5, warm_ms=10.0, warm_from_ms=0.5)
    # replays 1-4 (3 + 4 + 2 + 3 = 12 ms >= 10) warm it; 5-9 give 4, 2, 3, 4, 2 ms: median 3 / 4 calls
    assert len(replays) == 4 + 5 and ms == 3.0 / 4 and rewound == ["mark"]
    replays.clear()
    assert tuner.cuda_graph_timer(lambda: None, reps=5, warm_ms=10.0, warm_from_ms=1.0) == 3.0 / 4
    assert len(replays) == 1 + 5   # a call of 3 / 4 ms < 1 ms: the probe replay only, no warm-up
    replays.clear()
    tuner.cuda_graph_timer(lambda: None, reps=5)
    assert len(replays) == 5 and rewound == ["mark"] * 3
    # From rest: after the probe the card idles rest_s seconds, and the probe no longer counts.
    slept = []
    monkeypatch.setattr(tuner.time, "sleep", lambda s: slept.append((s, len(replays))))
    replays.clear()
    tuner.cuda_graph_timer(lambda: None, reps=5, warm_ms=10.0, warm_from_ms=0.5, rest_s=1.5)
    # probe 3; rest; 4 + 2 + 3 + 4 = 13 ms >= 10 warm it; then five timed replays
    assert slept == [(1.5, 1)] and len(replays) == 1 + 4 + 5
    replays.clear()
    tuner.cuda_graph_timer(lambda: None, reps=5, warm_ms=10.0, warm_from_ms=1.0, rest_s=1.5)
    assert slept == [(1.5, 1)] and len(replays) == 1 + 5   # a short call: no warm-up, so no rest
