"""Keys of the real templates: what vsr-tune records for a shape spec is what the runtime asks for."""
from dataclasses import replace

import pytest
import torch

from vsr.autotune import keys, shapes
from vsr.autotune.device_id import DeviceIdentity
from vsr.autotune.keys import kernel_source_hash, make_key
from vsr.kernels.registry import template_for

H200 = DeviceIdentity("nvidia", "NVIDIA H200", (9, 0), None, 132)


@pytest.mark.parametrize("fmt", ["bf16", "fp16", "fp32", "fp8", "int4-gptq", "int4-awq", "nvfp4-emulated"])
def test_shape_keys_match_real_weight_keys(fmt):
    fs = shapes.FORMATS[fmt]
    act = shapes.act_dtype_for(fs, None)
    small = shapes.weight_for(fs, 16, 256, act, "cpu")
    real = shapes.weight_for(fs, 48, 384, act, "cpu", seed=3)
    t = template_for(real, act, emulate=fs.emulate)
    assert template_for(small, act, emulate=fs.emulate) is t
    for b in (1, 64, 8192):
        k_real = make_key(t, t.problem(real, b, act), H200, triton="3.6.0")
        k_small = make_key(t, replace(t.problem(small, b, act), N=48, K=384), H200, triton="3.6.0")
        assert k_real == k_small
        assert shapes.format_label(k_real) == fmt


def test_source_hash_covers_shared_kernel_modules():
    # The key covers the vsr.kernels modules a template's module uses, each once: a KernelTemplate's
    # own hash already covers common.py (fp8's key adds nothing), a plain Template's only its module;
    # dense's adds pdl.py, which its launcher reads.
    from vsr.kernels import common, pdl
    from vsr.kernels.registry import TEMPLATES
    from vsr.kernels.template import Template
    f = TEMPLATES["fp8_w8a8"]
    assert any(m is common for m in vars(f.module).values())
    assert common in f.modules and len(set(f.modules)) == len(f.modules)
    assert kernel_source_hash(f) == f.source_hash
    t = TEMPLATES["dense"]
    assert pdl not in t.modules and any(m is pdl for m in vars(t.module).values())
    assert kernel_source_hash(t) != t.source_hash
    # The shared products (gemm.py) are in every template's hash: int4 reaches them only through
    # dense (its dequant path), nvfp4 through fp8. The tile spaces (gemm_tiles.py, shared, and
    # int4_tiles.py, int4's) are in none, though the templates import them
    # (template.TILE_CHOICE_MODULES): int4's launch-time choices (int4.DENSE_PATH) are in int4.py.
    from vsr.kernels import gemm, gemm_tiles, int4_tiles
    assert all(gemm in x.modules and gemm_tiles not in x.modules and int4_tiles not in x.modules
               for x in TEMPLATES.values())
    assert any(m is gemm_tiles for m in vars(f.module).values()) and kernel_source_hash(f) == f.source_hash
    i = TEMPLATES["int4_w4a16"]
    assert i.search_space is int4_tiles.search_space and kernel_source_hash(i) == i.source_hash
    plain = Template(name="dense_plain", module=t.module, search_space=t.search_space, default_tile=t.default_tile,
                     launch=t.launch, reference=t.reference, problem=t.problem)
    assert kernel_source_hash(plain) != plain.source_hash


def test_shape_specs():
    assert [s[1:] for s in shapes.parse_shapes("27b")] == [(10240, 5120), (5120, 8192), (34816, 5120), (5120, 17408)]
    # the runtime's products: q|k|v fused (1152 = 3 x 384), o, up, down
    assert [s[1:] for s in shapes.parse_shapes("minilm")] == [(1152, 384), (384, 384), (1536, 384), (384, 1536)]
    assert len(shapes.parse_shapes("27b,minilm,384x384")) == 8  # duplicates dropped
    with pytest.raises(ValueError, match="NxK"):
        shapes.parse_shapes("12x")
    from vsr.runtime.device import device_formats
    assert device_formats(H200) == ["bf16", "fp8", "int4-gptq", "int4-awq"]
    b200 = DeviceIdentity("nvidia", "NVIDIA B200", (10, 0), None, 148)
    assert "nvfp4" in device_formats(b200)
    a100 = DeviceIdentity("nvidia", "NVIDIA A100", (8, 0), None, 108)
    assert "fp8" not in device_formats(a100)
    # the device table's AMD rows: MI300X (gfx942) runs FP8; the CPU runs int4 unmeasured
    assert device_formats(DeviceIdentity("amd", "AMD Instinct MI300X", None, "gfx942", 304)) == [
        "bf16", "fp8", "int4-gptq", "int4-awq"]
    assert device_formats(DeviceIdentity("cpu", "x86_64", None, None, 2)) == ["bf16", "int4-gptq", "int4-awq"]


def test_format_with_activation_dtype():
    fs = shapes.parse_formats("fp8@fp32")[0]
    assert fs.fmt == "fp8" and shapes.act_dtype_for(fs, None) == torch.float32
    assert shapes.act_dtype_for(shapes.FORMATS["fp8"], None) == torch.bfloat16
    with pytest.raises(ValueError, match="dense"):
        shapes.parse_formats("bf16@fp32")
    with pytest.raises(ValueError, match="not one of"):
        shapes.parse_formats("fp8@int8")


def test_source_hash_is_per_template_not_per_module(monkeypatch):
    # Two templates of one kernel module with different dependencies must not share a memoised hash.
    from vsr.kernels import dense, fp8
    a = replace(dense.TEMPLATE, name="dense_no_extra_deps")
    b = replace(dense.TEMPLATE, name="dense_with_fp8_dep", deps=(fp8,))
    ha, hb = kernel_source_hash(a), kernel_source_hash(b)
    assert ha != hb
    # One name, other deps: the memo is keyed by the template, not its name.
    assert kernel_source_hash(replace(b, deps=a.deps)) == ha
    # What the memo serves is what a fresh computation gives.
    keys.kernel_source_hash.cache_clear()
    keys.module_code_text.cache_clear()
    assert kernel_source_hash(b) == hb and kernel_source_hash(a) == ha


def _module_from(tmp_path, name, text):
    import importlib.util
    path = tmp_path / f"{name}.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_code_text_ignores_comments_and_docstrings_not_code(tmp_path):
    from vsr.kernels.template import code_text, source_hash
    base = 'X = 1\n\n\ndef f(a):\n    return a + X\n'
    noted = ('"""A module docstring."""\n# a comment\nX = 1  # why one\n\n\ndef f(a):\n'
             '    """Doc,\n    on two lines."""\n    # note\n    return a + X\n')
    changed = 'X = 2\n\n\ndef f(a):\n    return a + X\n'
    keep_hash = '"""doc"""\nS = "# not a comment"\n'
    mods = [_module_from(tmp_path, f"m{i}", t) for i, t in enumerate((base, noted, changed, keep_hash))]
    assert code_text(mods[0]) == code_text(mods[1]) == "X = 1\ndef f(a):\n    return a + X\n"
    assert source_hash(mods[0]) == source_hash(mods[1]) != source_hash(mods[2])
    assert code_text(mods[3]) == 'S = "# not a comment"\n'
