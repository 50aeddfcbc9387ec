"""The registry (contract 5), the templates' search spaces and default tiles, and the rule that
no atomic touches a value."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from vsr.autotune.buckets import ROW_BUCKETS
from vsr.autotune.shapes import SHAPES_27B, SHAPES_MINILM
from vsr.kernels import common, dense, fp8, gemm, gemm_tiles, int4, nvfp4, registry
from vsr.kernels.template import Problem, Template, source_hash

KERNELS = Path(registry.__file__).resolve().parent


def weights():
    g = torch.Generator().manual_seed(0)
    N, K = 40, 256
    return {
        "dense": dense.DenseWeight(torch.randn(N, K, generator=g).half()),
        "fp8": fp8.Fp8Weight(fp8.e4m3_rne(torch.randn(N, K, generator=g)), torch.rand(N, generator=g).half()),
        "int4": int4.Int4Weight(int4.pack_int4(torch.randint(0, 16, (N, K), generator=g, dtype=torch.int32)),
                                torch.rand(N, K // 128, generator=g).half(), K, 128),
        "nvfp4": nvfp4.Nvfp4Weight(torch.randint(0, 255, (N, K // 2), generator=g, dtype=torch.int32).to(torch.uint8),
                                   torch.rand(N, K // 16, generator=g).to(torch.float8_e4m3fn),
                                   torch.tensor(100.0), torch.tensor(50.0)),
    }


def test_no_atomic_touches_a_value_in_any_kernel_module():
    # Reductions are never atomic: split-K and stream-K partials are added from a workspace in a
    # fixed order. The one place an atomic may appear is common.last_to_finish, the in-kernel
    # fixup's ticket, which counts arrivals on an int32 counter and resets it: no value passes
    # through it, so the bytes do not depend on the order of arrival.
    # (Triton's atomics, and PTX's atom./red. in inline assembly; a comment may say "atomic".)
    offenders = [p.name for p in KERNELS.glob("*.py")
                 if p.name != "common.py" and re.search(r"tl\.atomic_|\batom\.|\bred\.", p.read_text())]
    assert offenders == [], f"atomics in {offenders}"
    assert re.findall(r"tl\.atomic_\w+\(([^,]+),", (KERNELS / "common.py").read_text()) == ["cnt_ptr", "cnt_ptr"]
    src = (KERNELS / "common.py").read_text()
    fixup = src[src.index("def last_to_finish"):]
    fixup = fixup[:fixup.index("\n@triton.jit")]
    assert src.count("atomic_") == fixup.count("atomic_") == 2


def test_templates_are_named_as_the_contract_says():
    assert set(registry.TEMPLATES) == {"dense", "fp8_w8a8", "int4_w4a16", "nvfp4_w4a4", "nvfp4_emulated"}
    for name, t in registry.TEMPLATES.items():
        assert isinstance(t, Template) and t.name == name
        assert re.fullmatch(r"[0-9a-f]{16}", t.source_hash)
        # The hash covers the shared kernel pieces too (split-K reduction, epilogue), not
        # only the format's own module: a change there must not reuse recorded tiles.
        assert t.source_hash != source_hash(t.module)


def test_template_for_picks_by_format():
    w = weights()
    assert registry.template_for(w["dense"], torch.float16).name == "dense"
    assert registry.template_for(w["fp8"], torch.bfloat16).name == "fp8_w8a8"
    assert registry.template_for(w["int4"], torch.bfloat16).name == "int4_w4a16"
    assert registry.template_for(w["nvfp4"], torch.bfloat16, emulate=True).name == "nvfp4_emulated"


@pytest.mark.skipif(torch.cuda.is_available() and torch.cuda.get_device_capability()[0] in (10, 12),
                    reason="this device has FP4 tensor cores")
def test_nvfp4_without_emulation_is_refused_off_blackwell():
    with pytest.raises(RuntimeError, match="FP4 tensor cores"):
        registry.template_for(weights()["nvfp4"], torch.bfloat16)


def test_nvfp4a16_runs_the_emulation_kernel_without_a_flag():
    w = weights()["nvfp4"]
    a16 = nvfp4.Nvfp4Weight(w.packed, w.block_scale, w.global_scale, None)
    assert registry.template_for(a16, torch.float16).name == "nvfp4_emulated"


def test_template_for_refuses_mismatches():
    w = weights()
    with pytest.raises(ValueError, match="dense weight is torch.float16"):
        registry.template_for(w["dense"], torch.float32)
    with pytest.raises(ValueError, match="int4_w4a16 takes activations"):
        registry.template_for(w["int4"], torch.float8_e4m3fn)
    with pytest.raises(ValueError, match="no Triton template for weight format 'mystery'"):
        registry.template_for(type("W", (), {"format": "mystery"})(), torch.float16)


# Bytes per element of the operand tiles each template stages in shared memory (fp16 activations).
@pytest.mark.parametrize("fmt,name,ab", [("dense", "dense", (2, 2)), ("fp8", "fp8_w8a8", (1, 1)),
                                         ("int4", "int4_w4a16", (2, 0.5)), ("nvfp4", "nvfp4_emulated", (2, 0.5625)),
                                         ("nvfp4", "nvfp4_w4a4", (0.5625, 0.5625))])
def test_search_spaces_per_bucket(fmt, name, ab):
    w = weights()[fmt]
    t = registry.TEMPLATES[name]
    for b in ROW_BUCKETS:
        p = t.problem(w, b, torch.float16)
        assert p.bucket == b and (p.N, p.K) == (w.N, w.K) and p.params == w.params()
        space = t.search_space(p)
        d = t.default_tile(p)
        assert space[0] == d, "the default tile comes first"
        assert d == t.default_tile(p), "the default tile is deterministic"
        assert 3 <= len(space) <= 80   # (fp8 from bucket 1024: 72, with persistent and stream-K forms)
        keys = [tuple(sorted(c.items())) for c in space]
        assert len(set(keys)) == len(keys), "no duplicate candidates"
        for c in space:
            common.check_tile(c, getattr(t.module, "WIDE_PATHS", ()))   # nvfp4's spaces hold no wide tiles
            assert (c["BLOCK_M"] >= 16 or c["path"] == "gemv") and c["BLOCK_K"] >= 32
            assert gemm_tiles.smem_bytes(c, *ab) <= gemm_tiles.SMEM_LIMIT
            if fmt == "int4" and c["path"] in ("splitk", "tiled"):
                assert 128 % c["BLOCK_K"] == 0, "a tensor-core tile lies inside one group"
        # Small buckets take the split-K path (int4: the GEMV at one row), large ones a tiled path:
        # TMA descriptors where the operands' row strides are 16-byte multiples, never for nvfp4.
        tma = fmt in ("dense", "fp8", "int4") and (w.K * 2) % 16 == 0
        if fmt == "int4":  # a transient dense tile for large M
            # (group 128, half-precision activations: the nibble-slice product up to bucket 128)
            assert w.group_size == 128
            assert d["path"] == ("slices" if b <= 128 else "dequant" if not tma else
                                 "dequant-sk" if 512 <= b <= 2048 else "dequant-tma")
            if b == 1:
                assert {"splitk", "gemv"} <= {c["path"] for c in space}, "the GEMV and split-K stay candidates"
            if b <= 128:
                assert {"swap", "slices"} <= {c["path"] for c in space} or b == 1
            joins = [c for c in space if c["path"] == "join"]
            assert bool(joins) == (b >= 16), "join: from bucket 16"
            assert any(c.get("SCALE_W") for c in joins) == bool(joins), "SCALE_W tiles wherever join is"
            if b > 256:   # only the join tiles of 256 weight rows (int4_tiles._WIDE_JOIN)
                assert all(c["BLOCK_N"] == 256 and c.get("SCALE_W") for c in joins), b
            xs = [c for c in space if c.get("X_SPLIT")]
            assert all(c["path"] == "slices" for c in xs)
            if b == 1:   # one row: every slices tile also reading x in place (X_ROW), those first
                plain = [c for c in space if c["path"] == "slices" and not c.get("X_SPLIT")]
                assert [dict(c, X_SPLIT=1) for c in plain] == xs and d == xs[0]
            elif b <= 4:   # every slices tile also reading x as stored, after them (X_ROW at M=2)
                plain = [c for c in space if c["path"] == "slices" and not c.get("X_SPLIT")]
                assert [dict(c, X_SPLIT=1) for c in plain] == xs and space.index(xs[0]) > space.index(plain[-1])
                assert {c["BLOCK_M"] for c in xs} == {16}, "X_ROW for two rows at most"
            else:
                assert len(xs) == (b <= 16), "X_SPLIT: the default's copy at buckets 8-16"
            p32 = t.problem(w, b, torch.float32)      # fp32 activations: the paths before slices
            assert not any(c["path"] == "join" for c in t.search_space(p32)), "join takes half-precision x"
            assert t.default_tile(p32)["path"] == ("gemv" if b == 1 else "swap" if b <= 128 else
                                                   "dequant" if (w.K * 4) % 16 else
                                                   "dequant-sk" if 512 <= b <= 2048 else "dequant-tma")
        else:   # (fp16 activations: the transposed TMA product for few rows where the strides allow)
            assert d["path"] == ("tma-swap" if b <= 32 and tma else "splitk" if b <= 16 else "tiled" if not tma else
                                 "tma-sk" if 512 <= b <= 2048 else "tma")
            if tma and b >= 256:
                sk = [c for c in space if c["path"] == "tma-sk"]
                tall = [(c["BLOCK_N"], c["num_warps"], c["num_stages"]) for c in sk if c["BLOCK_M"] == 256]
                assert tall == (list(gemm_tiles.TALL_SK_256) if b == 256 else []), "256-row stream-K: bucket 256"
                assert sk and all(c["BLOCK_M"] == 128 and c["num_warps"] == 8 for c in sk if c["BLOCK_M"] != 256), \
                    "stream-K: 128-row tiles on 8 warps"
                assert all(c["BLOCK_K"] == gemm_tiles.k_step(ab[0]) for c in sk if c["BLOCK_M"] == 256)
            if b <= 16 and tma:
                assert any(c["path"] == "splitk" for c in space), "the split-K tiles stay candidates"
            if b == 1 and fmt in ("dense", "fp8"):
                assert any(c["path"] == "gemv" for c in space), "the CUDA-core GEMV is a candidate at one row"
        if b >= 32 and fmt in ("dense", "fp8"):
            assert {c["path"] for c in space} >= {"tma", "tiled"}, "both tiled forms are candidates"
        if b == 32 and fmt in ("dense", "fp8") and tma:
            # The transposed product on 32 rows as the default (fp8's product always takes e4m3 x),
            # 64-row tiles among the candidates, and for dense fp32 x (no transposed product) the
            # 64-row TMA tile as the default.
            assert d["path"] == "tma-swap" and d["BLOCK_M"] == 32
            assert any(c["BLOCK_M"] == 64 and c["path"] == "tiled" for c in space)
            if fmt == "dense":
                assert gemm_tiles.default_gemm_tile(b, w.N, w.K, 4, 4)["BLOCK_M"] == 64


@pytest.mark.parametrize("name", ["dense", "fp8_w8a8"])
def test_narrow_products_above_bucket_128_take_split_k_candidates(name):
    # Qwen3.5's in_proj_b|a (96 x 5120) at 1,024 rows makes 8 output tiles of 128 x 128: split-K
    # tiles that give about one program per multiprocessor join its space; the 27B-class qkv does not.
    t = registry.TEMPLATES[name]
    for bucket in (256, 1024, 2048):
        sk = [c for c in t.search_space(Problem(96, 5120, bucket, torch.bfloat16, ())) if c["path"] == "splitk"]
        assert {(c["BLOCK_M"], c["num_warps"]) for c in sk} == {(64, 4), (128, 8)}, (bucket, sk)
        for c in sk:
            programs = common.cdiv(bucket, c["BLOCK_M"]) * c["SPLIT_K"]
            assert 132 <= programs < 2 * 132 or c["SPLIT_K"] == 16, (bucket, c)
    assert not any(c["path"] == "splitk" for c in t.search_space(Problem(96, 5120, 8192, torch.bfloat16, ())))
    assert not any(c["path"] == "splitk" for c in t.search_space(Problem(10240, 5120, 1024, torch.bfloat16, ())))


def test_split_plan_covers_k_in_whole_tiles():
    for K in (256, 5120, 17408, 200):
        for split in (1, 2, 3, 4, 16):
            ks, n = common.split_plan(K, {"BLOCK_K": 64, "SPLIT_K": split})
            assert ks % 64 == 0 and n >= 1 and (n - 1) * ks < K <= n * ks


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_every_default_tile_fits_for_every_activation_dtype(dtype):
    g = torch.Generator().manual_seed(1)
    cases = [(registry.TEMPLATES["dense"], dense.DenseWeight(torch.randn(40, 256, generator=g).to(dtype)))]
    w = weights()
    cases += [(registry.TEMPLATES["fp8_w8a8"], w["fp8"]), (registry.TEMPLATES["nvfp4_emulated"], w["nvfp4"]),
              (registry.TEMPLATES["nvfp4_emulated"], nvfp4.Nvfp4Weight(w["nvfp4"].packed, w["nvfp4"].block_scale,
                                                                      w["nvfp4"].global_scale, None))]
    cases.append((registry.TEMPLATES["int4_w4a16"], w["int4"]))
    for t, wt in cases:
        for b in ROW_BUCKETS:
            space = t.search_space(t.problem(wt, b, dtype))   # raises if the default tile does not fit
            assert space[0] == t.default_tile(t.problem(wt, b, dtype))


def test_fp8_default_tiles_leave_room_for_an_fp32_output():
    # fp32 activations give an fp32 output, which the TMA kernels' epilogue stages whole in shared
    # memory beside the pipeline (fp8._fit_fp32_epilogue; sm_90 compiles of every launch:
    # benchmarks/sm90_fit.py). bf16 activations keep their tiles.
    for _, N, K in SHAPES_27B + SHAPES_MINILM:
        w = fp8.Fp8Weight(torch.empty(N, K, dtype=torch.float8_e4m3fn), torch.ones(N))
        for b in ROW_BUCKETS:
            t = fp8.default_tile(fp8.problem(w, b, torch.float32))
            if t["path"] in gemm.TMA_PATHS:
                out = t["BLOCK_M"] * (t["BLOCK_N"] + t.get("BLOCK_N2", 0)) * 4
                assert gemm_tiles.smem_bytes(t, 1, 1) + out <= gemm_tiles.SMEM_LIMIT, (N, K, b, t)
            bf16 = fp8.default_tile(fp8.problem(w, b, torch.bfloat16))
            assert t == bf16 or (b >= 1024 and t == dict(bf16, BLOCK_K=bf16["BLOCK_K"] // 2)), (b, t, bf16)


def test_fp8_search_spaces_with_fp32_activations_hold_only_tiles_that_fit_their_output():
    # The same bound on every candidate, not only the default: a tile that cannot compile beside its
    # fp32 output costs the tuner its compile time. bf16 activations keep every tile (their output is not staged whole).
    for _, N, K in SHAPES_27B[:2] + SHAPES_MINILM[:1]:
        w = fp8.Fp8Weight(torch.empty(N, K, dtype=torch.float8_e4m3fn), torch.ones(N))
        for b in (1, 64, 256, 1024, 4096):
            fp32 = fp8.search_space(fp8.problem(w, b, torch.float32))
            bf16 = fp8.search_space(fp8.problem(w, b, torch.bfloat16))
            for t in fp32:
                if t["path"] in gemm.TMA_PATHS:
                    out = t["BLOCK_M"] * (t["BLOCK_N"] + t.get("BLOCK_N2", 0)) * 4
                    assert gemm_tiles.smem_bytes(t, 1, 1) + out <= gemm_tiles.SMEM_LIMIT, (N, K, b, t)
            dropped = [t for t in bf16 if t not in fp32]
            assert all(t["path"] in gemm.TMA_PATHS for t in dropped)
            assert bool(dropped) == (b >= 256), (N, K, b, len(dropped))


@pytest.mark.parametrize("name", ["dense", "fp8_w8a8"])
def test_128_row_split_k_tiles_at_bucket_128(name):
    # At 128 rows a product of fewer 128-column output tiles than multiprocessors (the 27B-class o,
    # down and qkv; not gate_up) takes split-K tiles over all 128 rows on 8 warps, K split for about
    # one wave of programs and half that; int4's space (pointer-load paths of its own) does not.
    t = registry.TEMPLATES[name]
    for N, K, splits in ((5120, 8192, {2, 4}), (5120, 17408, {2, 4}), (10240, 5120, {2}), (96, 5120, {8, 16})):
        sk = [c for c in t.search_space(Problem(N, K, 128, torch.bfloat16, ()))
              if c["path"] == "splitk" and c["BLOCK_M"] == 128]
        assert {c["SPLIT_K"] for c in sk} == splits and all(c["num_warps"] == 8 for c in sk), (N, K, sk)
        assert {c["BLOCK_K"] for c in sk} == {64, 128}
    assert not any(c["path"] == "splitk" and c["BLOCK_M"] == 128
                   for c in t.search_space(Problem(34816, 5120, 128, torch.bfloat16, ())))
    assert not any(c["path"] == "splitk" and c["BLOCK_M"] == 128
                   for c in t.search_space(Problem(5120, 8192, 64, torch.bfloat16, ())))
