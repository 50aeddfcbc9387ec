"""benchmarks/common_bench.py's weights on the CPU: made as the tuner makes a key's (scales in
the model dtype, the key's activation dtype), so a tool checking an fp32 key runs fp32 scales."""
import pytest
import torch


@pytest.fixture(scope="module")
def common_bench(bench_script):
    return bench_script("common_bench")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_scales_and_bias_take_the_model_dtype(common_bench, dtype):
    for fmt, scale in (("fp8", "weight_scale"), ("int4-gptq", "scale"), ("int4-awq", "scale")):
        w = common_bench.make_weight(fmt, 24, 256, "cpu", seed=3, bias=True, model_dtype=dtype)
        assert getattr(w, scale).dtype == dtype and w.bias.dtype == dtype, fmt
        assert bool((getattr(w, scale).float() > 0).all()) and bool(w.bias.ne(0).any())
    # A dense weight keeps its format's dtype (the runtime converts it to the activations').
    for fmt, wdtype in (("bf16", torch.bfloat16), ("fp16", torch.float16), ("fp32", torch.float32)):
        w = common_bench.make_weight(fmt, 24, 256, "cpu", bias=True, model_dtype=dtype)
        assert w.weight.dtype == wdtype and w.bias.dtype == dtype


def test_the_default_model_dtype_is_bf16(common_bench):
    w = common_bench.make_weight("int4-awq", 24, 256, "cpu", bias=True)
    assert w.scale.dtype == torch.bfloat16 and w.bias.dtype == torch.bfloat16
    same = common_bench.make_weight("int4-awq", 24, 256, "cpu", bias=True, model_dtype=torch.bfloat16)
    assert torch.equal(w.packed, same.packed) and torch.equal(w.scale, same.scale)


def test_the_gpu_state_reads_what_nvml_gives_and_none_for_the_rest(common_bench, monkeypatch):
    monkeypatch.setattr(torch.cuda, "temperature", lambda: 61)
    monkeypatch.setattr(torch.cuda, "power_draw", lambda: 512_000)   # mW

    def no_clock():
        raise ModuleNotFoundError("pynvml")
    monkeypatch.setattr(torch.cuda, "clock_rate", no_clock)
    assert common_bench.gpu_state() == {"temp_c": 61, "power_w": 512.0, "sm_mhz": None}


def test_the_steady_timer_calls_after_as_each_timed_case_ends(common_bench, monkeypatch):
    order = []

    def graph_ms(fns, target_ms, reps, warm_ms, rest_s):
        assert warm_ms == common_bench.tuner.STEADY_WARM_MS   # each case in its own steady state
        assert rest_s == 0.5                                  # from the rest it was asked to start from
        order.append(("timed", fns))
        if fns == "bad":
            raise RuntimeError("capture failed")
        return 1.0
    monkeypatch.setattr(common_bench, "graph_ms", graph_ms)
    times, errors = common_bench.steady_graph_ms({"a": "ok", "b": "bad", "c": "ok"}, after=lambda n: order.append(n),
                                                 rest_s=0.5)
    assert times == {"a": 1.0, "c": 1.0} and list(errors) == ["b"]
    assert order == [("timed", "ok"), "a", ("timed", "bad"), ("timed", "ok"), "c"]
