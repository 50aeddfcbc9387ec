"""benchmarks/common_bench's steady_graph_ms, which bench_gemm.py times every provider with, and the
tuner's warm-up (GPU only: CUDA graphs)."""
from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.gpu


def test_each_case_keeps_its_own_time_and_a_case_that_cannot_be_captured_is_reported(bench_script):
    common_bench = bench_script("common_bench")
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA graphs")
    timed = common_bench.steady_graph_ms
    a = torch.randn(2048, 2048, device="cuda")
    small, large = [lambda: a[:256, :256] @ a[:256, :256]], [lambda: a @ a, lambda: a @ a]

    def host_sync():   # a call that synchronizes cannot be captured
        torch.cuda.synchronize()
        return a.sum().item()
    times, errors = timed({"small": small, "large": large, "sync": [host_sync]})
    assert set(times) == {"small", "large"} and set(errors) == {"sync"}
    assert 0 < times["small"] < times["large"], times   # per call: 256^3 against 2048^3 flops
    # Timed alone, the large case's figure is of the same order (a per-call time, not per graph).
    alone, _ = timed({"large": large})
    assert 0.5 < alone["large"] / times["large"] < 2.0


def test_the_tuners_timer_warms_a_long_call_for_warm_ms_and_not_a_short_one():
    import time

    from vsr.autotune import tuner
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA graphs")
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    long_call, short_call = (lambda: a @ a), (lambda: a[:16, :16] + 1)
    for fn, warmed in ((long_call, True), (short_call, False)):
        tuner.cuda_graph_timer(fn, warm_ms=0.0)   # compiled and captured once before the clock
        t0 = time.perf_counter()
        ms = tuner.cuda_graph_timer(fn, warm_ms=300.0, warm_from_ms=tuner.STEADY_MIN_CALL_MS)
        took = (time.perf_counter() - t0) * 1e3
        assert ms > 0
        assert (took >= 300.0) == warmed, (took, ms)
