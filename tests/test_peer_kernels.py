"""benchmarks/peer_kernels.py on the CPU: the tile a cuBLAS kernel's name spells, and the
per-kernel rows of a profiler trace (the profiles themselves come from the H200)."""
import pytest
import torch


@pytest.fixture(scope="module")
def peer_kernels(bench_script):
    return bench_script("peer_kernels")


def test_tiles_of_cublas_kernel_names(peer_kernels):
    cutlass = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64_cluster2x1x1_warpgroupsize2x1x1_kernel"
    assert peer_kernels.tile_of_name(cutlass) == {"tile": [128, 256], "k": 64, "cluster": [2, 1, 1]}
    assert peer_kernels.tile_of_name("sm80_xmma_gemm_tilesize64x64x32_stage6") == {"tile": [64, 64], "k": 32}
    assert peer_kernels.tile_of_name("nvjet_hsh_256x128_64x4_1x2_h_bz_coopA_NNT") == \
        {"tile": [256, 128], "k": 64, "stages": 4, "cluster": [1, 2]}
    assert peer_kernels.tile_of_name("_dense_tma_kernel") is None


def test_kernel_rows_sum_launches_per_call_and_skip_host_events(peer_kernels):
    ev = [{"cat": "kernel", "name": "a", "dur": 10.0, "args": {"grid": [132, 1, 1], "block": [384, 1, 1],
                                                               "registers per thread": 168, "shared memory": 1024}},
          {"cat": "cpu_op", "name": "aten::mm", "dur": 50.0},
          {"cat": "kernel", "name": "b", "dur": 2.0, "args": {}},
          {"cat": "kernel", "name": "a", "dur": 14.0, "args": {"grid": [132, 1, 1]}}]
    rows = peer_kernels.kernels_of(ev, calls=2)
    assert [r["name"] for r in rows] == ["a", "b"]
    a, b = rows
    assert a["us_per_call"] == 12.0 and a["launches_per_call"] == 1.0 and a["grid"] == [132, 1, 1]
    assert a["registers"] == 168 and a["smem"] == 1024 and a["tile"] is None
    assert b["us_per_call"] == 1.0 and b["launches_per_call"] == 0.5 and b["grid"] is None


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA")
def test_without_cuda_it_says_so(peer_kernels, monkeypatch, capsys):
    monkeypatch.setattr("sys.argv", ["peer_kernels.py"])
    assert peer_kernels.main() == 2 and "needs a CUDA device" in capsys.readouterr().err
