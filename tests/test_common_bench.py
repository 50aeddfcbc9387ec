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
