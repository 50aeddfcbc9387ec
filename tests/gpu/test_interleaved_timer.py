"""benchmarks/common_bench.interleaved_graph_ms, which bench_gemm.py times every provider of a point
with (GPU only: CUDA graphs)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.gpu

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))


def test_each_case_keeps_its_own_time_and_a_case_that_cannot_be_captured_is_reported():
    from common_bench import interleaved_graph_ms
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA graphs")
    a = torch.randn(2048, 2048, device="cuda")
    small, large = [lambda: a[:256, :256] @ a[:256, :256]], [lambda: a @ a, lambda: a @ a]
    ran = []

    def host_sync():   # a call that synchronizes cannot be captured
        ran.append(1)
        torch.cuda.synchronize()
        return a.sum().item()
    times, errors = interleaved_graph_ms({"small": small, "large": large, "sync": [host_sync]}, rounds=5)
    assert set(times) == {"small", "large"} and set(errors) == {"sync"}
    assert 0 < times["small"] < times["large"], times   # per call: 256^3 against 2048^3 flops
    # Timed again alone, the large case's figure is of the same order (a per-call time, not per graph).
    alone, _ = interleaved_graph_ms({"large": large}, rounds=5)
    assert 0.5 < alone["large"] / times["large"] < 2.0
