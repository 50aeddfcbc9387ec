"""benchmarks/variants.py's studies build, run and check every case: their orchestration under the
interpreter on a tiny shape (the figures themselves come from the H200)."""
import importlib.util
import sys
from pathlib import Path

import pytest
import torch


BENCH = Path(__file__).resolve().parent.parent / "benchmarks"
DEV = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(scope="module")
def variants():
    sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location("vsr_bench_variants", BENCH / "variants.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("study,ms", [("small-m", [1, 5]), ("persistent", [40]), ("int4-slices", [5])])
def test_each_study_runs_every_case(variants, monkeypatch, study, ms):
    # The studies on a tiny shape, timing replaced by running the calls: every case is built, run,
    # checked against its reference and recorded (the figures themselves come from the H200).
    # fp16 activations: the interpreter's bf16 tl.dot is wrong, so bf16 outputs could not be checked.
    monkeypatch.setattr(variants, "DEV", DEV)
    monkeypatch.setattr(variants, "ACT", torch.float16)
    monkeypatch.setattr(variants, "SHAPES", {"tiny": (64, 256)})
    calls = []
    monkeypatch.setattr(variants, "graph_ms", lambda fns: calls.extend(f() for f in fns) or 1.0)
    rows = variants.STUDIES[study][0](["tiny"], ms, lambda r: None)
    cases = [r for r in rows if r["variant"] != "cublas-bf16"]
    assert cases and all("error" not in r for r in cases), [r.get("error") for r in cases]
    assert all(r["ok"] for r in cases), [(r["variant"], r["tile"], r["rel_err"]) for r in cases if not r["ok"]]
    assert len(calls) >= len(rows), "every timed case ran its calls"


@pytest.mark.parametrize("symmetric,split,K,xperm,repack", [(True, 1, 256, False, False),
                                                            (False, 2, 380, False, False),  # 380: a partial last word
                                                            (False, 2, 384, True, False), (False, 2, 376, False, True),
                                                            (True, 3, 384, True, True)])
def test_int4_slices_variant_matches_reference(variants, symmetric, split, K, xperm, repack):
    from vsr.kernels import int4
    g = torch.Generator().manual_seed(K + split)
    N, M, G = 37, 5, 128
    KG = -(-K // G)
    zp = None if symmetric else torch.randint(0, 16, (N, KG), generator=g, dtype=torch.int32)
    w = int4.Int4Weight(int4.pack_int4(torch.randint(0, 16, (N, K), generator=g, dtype=torch.int32)),
                        (torch.rand(N, KG, generator=g) * 0.05 + 1e-3).half(), K, G, zp, None, None).to(DEV)
    x = torch.randn(M, K, generator=g).half().to(DEV)
    tile = {"path": "int4-slices", "BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 128, "SPLIT_K": split, "GROUP_M": 2,
            "num_warps": 4, "num_stages": 2}
    y = variants.launch_int4_slices(x, w, tile, xperm=xperm,
                                    repacked=variants.repack_pairs(w.packed) if repack else None)
    torch.testing.assert_close(y, int4.reference_linear(x, w), rtol=2e-3, atol=2e-3)


def test_repack_pairs_moves_nibble_halves(variants):
    from vsr.kernels import int4
    u = torch.randint(0, 16, (3, 24), generator=torch.Generator().manual_seed(5), dtype=torch.int32)
    packed = int4.pack_int4(u)                                   # 3 words per row: an odd count
    r = variants.repack_pairs(packed).to(torch.int64) & 0xFFFFFFFF
    assert r.shape == (3, 4)
    nib = lambda word, i: (word >> (4 * i)) & 0xF               # noqa: E731
    for p in range(2):
        for j in range(4):
            a, b = 16 * p, 16 * p + 8                            # the pair's words start at these nibbles
            assert torch.equal(nib(r[:, 2 * p], j), u[:, a + j].long())
            assert torch.equal(nib(r[:, 2 * p], j + 4), u[:, b + j].long() if b < 24 else torch.zeros(3).long())
            assert torch.equal(nib(r[:, 2 * p + 1], j), u[:, a + 4 + j].long())
            assert torch.equal(nib(r[:, 2 * p + 1], j + 4), u[:, b + 4 + j].long() if b < 24 else torch.zeros(3).long())
