"""The device table: every row of the seeds' table, simulated by DeviceIdentity and injected probes."""
import pytest
import torch

from vsr.autotune.device_id import DeviceIdentity
from vsr.runtime import device as d
from vsr.runtime.errors import DeviceRefusal

ALL_SOFTWARE = d.Probes(torch_fp4=True, triton=True, dot_scaled=True)

MI300X = DeviceIdentity("amd", "AMD Instinct MI300X", None, "gfx942", 304)
MI355 = DeviceIdentity("amd", "AMD Instinct MI355X", None, "gfx950", 256)
RX7900 = DeviceIdentity("amd", "Radeon RX 7900 XTX", None, "gfx1100", 96)
MI250 = DeviceIdentity("amd", "AMD Instinct MI250X", None, "gfx90a", 110)
MI50 = DeviceIdentity("amd", "Radeon Instinct MI50", None, "gfx906", 60)
A100 = DeviceIdentity("nvidia", "NVIDIA A100", (8, 0), None, 108)
RTX3090 = DeviceIdentity("nvidia", "NVIDIA GeForce RTX 3090", (8, 6), None, 82)
L40 = DeviceIdentity("nvidia", "NVIDIA L40S", (8, 9), None, 142)
H200 = DeviceIdentity("nvidia", "NVIDIA H200", (9, 0), None, 132)
B200 = DeviceIdentity("nvidia", "NVIDIA B200", (10, 0), None, 148)
RTX6000B = DeviceIdentity("nvidia", "NVIDIA RTX PRO 6000 Blackwell", (12, 0), None, 188)
V100 = DeviceIdentity("nvidia", "Tesla V100", (7, 0), None, 80)
T4 = DeviceIdentity("nvidia", "Tesla T4", (7, 5), None, 40)
XPU = DeviceIdentity("intel", "Intel Arc A770", None, None, 32)
CPU = DeviceIdentity("cpu", "x86_64", None, None, 2)
THOR = DeviceIdentity("nvidia", "NVIDIA Thor", (11, 0), None, 20)   # a capability the seeds do not list

# The seeds' table: device -> (FP8, int4, NVFP4) support levels ("no" = refused).
TABLE = [
    (MI300X, "yes", "yes", "no"),
    (MI355, "yes", "yes", "no"),
    (RX7900, "no", "not validated", "no"),
    (MI250, "no", "not validated", "no"),
    (A100, "no", "yes", "no"),
    (RTX3090, "no", "yes", "no"),
    (L40, "yes", "yes", "no"),
    (H200, "yes", "yes", "no"),
    (B200, "yes", "yes", "yes"),
    (RTX6000B, "yes", "yes", "yes"),
    (XPU, "no", "not validated", "no"),
    (CPU, "no", "not measured", "no"),
    (THOR, "yes", "not validated", "no"),
]


def _level(fmt, ident, dtype=torch.float32, probes=ALL_SOFTWARE):
    try:
        return d.check_package({fmt}, dtype, ident, probes=probes)
    except DeviceRefusal:
        return "no"


@pytest.mark.parametrize("ident,fp8,int4,nvfp4", TABLE, ids=[t[0].name for t in TABLE])
def test_every_row_of_the_table(ident, fp8, int4, nvfp4):
    assert _level("fp8", ident) == fp8
    assert _level("int4", ident) == int4
    assert _level("nvfp4", ident) == nvfp4
    # Dense runs everywhere a GPU has BF16, at every dtype.
    for dtype in (torch.float32, torch.bfloat16, torch.float16, "bfloat16", None):
        assert _level("dense", ident, dtype) == "yes"


def test_table_notes_are_kept():
    assert d.row_for(MI300X).fp8.note == "E4M3 FNUZ"
    assert d.row_for(MI355).fp8.note == "E4M3"
    assert d.row_for(H200).int4.note == "with the fused kernel"
    assert d.row_for(B200).nvfp4.note == "with Triton"
    assert d.row_for(RTX3090).label == "NVIDIA Ampere (compute capability 8.0, 8.6)"


@pytest.mark.parametrize("ident", [A100, RTX3090, RX7900, XPU, CPU, T4])
def test_fp8_refusal_is_the_seed_sentence(ident):
    with pytest.raises(DeviceRefusal) as e:
        d.check_package({"fp8"}, torch.bfloat16 if ident is not T4 else torch.float32, ident,
                        probes=ALL_SOFTWARE)
    msg = str(e.value)
    assert msg.startswith("FP8 weights need an NVIDIA GPU of compute capability 8.9 or later "
                          "or an AMD Instinct MI300 or MI350 series GPU")
    assert ident.name in msg
    assert "--emulate" in msg


@pytest.mark.parametrize("ident,hardware,torch_fp4,triton,dot_scaled,missing", [
    (H200, True, True, True, True, [d.MISSING_FP4_CORES]),
    (CPU, True, True, True, True, [d.MISSING_FP4_CORES]),
    (MI300X, True, True, True, True, [d.MISSING_FP4_CORES]),
    (B200, False, False, True, True, [d.MISSING_TORCH_FP4]),
    (B200, False, True, False, False, [d.MISSING_TRITON]),
    (RTX6000B, False, True, True, False, [d.MISSING_TRITON]),
    (A100, True, False, False, False, [d.MISSING_FP4_CORES, d.MISSING_TORCH_FP4, d.MISSING_TRITON]),
])
def test_nvfp4_refusal_names_what_is_missing(ident, hardware, torch_fp4, triton, dot_scaled, missing):
    probes = d.Probes(torch_fp4, triton, dot_scaled)
    with pytest.raises(DeviceRefusal) as e:
        d.check_package({"nvfp4"}, torch.bfloat16, ident, probes=probes)
    msg = str(e.value)
    assert msg.startswith(d.NVFP4_NEEDS)
    for piece in (d.MISSING_FP4_CORES, d.MISSING_TORCH_FP4, d.MISSING_TRITON):
        assert (piece in msg) == (piece in missing), (piece, msg)


@pytest.mark.parametrize("ident", [V100, T4, MI50])
def test_gpu_without_bf16_runs_no_decision_class_package(ident):
    for fmts in ({"dense"}, {"int4"}, {"dense", "int4"}):
        with pytest.raises(DeviceRefusal) as e:
            d.check_package(fmts, torch.bfloat16, ident, probes=ALL_SOFTWARE)
        assert d.BF16_RULE in str(e.value)
        assert "BF16" in str(e.value).split(":")[0]
    # int4 multiplies in BF16, so it is refused even for an FP32 model; FP32/FP16 dense runs.
    with pytest.raises(DeviceRefusal, match="no BF16 support"):
        d.check_package({"int4"}, torch.float32, ident, probes=ALL_SOFTWARE)
    assert d.check_package({"dense"}, torch.float32, ident) == "yes"
    assert d.check_package({"dense"}, "float16", ident) == "yes"
    # The emulation keeps the package's dtype, so it cannot lift the BF16 refusal.
    with pytest.raises(DeviceRefusal, match="no BF16 support"):
        d.check_package({"fp8"}, torch.bfloat16, ident, emulate=True, probes=ALL_SOFTWARE)


def test_cpu_bf16_package_is_not_a_gpu_refusal():
    assert d.check_package({"dense"}, torch.bfloat16, CPU) == "yes"


@pytest.mark.parametrize("ident", [CPU, A100, XPU])
def test_emulation_is_explicit(ident):
    for fmt in ("fp8", "nvfp4"):
        with pytest.raises(DeviceRefusal):
            d.check_package({fmt}, torch.float32, ident, probes=ALL_SOFTWARE)
        assert d.check_package({fmt}, torch.float32, ident, emulate=True, probes=ALL_SOFTWARE) == "emulated"
        assert d.check_package({"dense", fmt}, torch.float32, ident, emulate=True,
                               probes=ALL_SOFTWARE) == "emulated"


def test_mixed_formats_take_the_weakest_level():
    assert d.check_package({"dense", "int4"}, torch.float32, CPU) == "not measured"
    assert d.check_package({"dense", "fp8"}, torch.bfloat16, H200) == "yes"
    with pytest.raises(DeviceRefusal, match="FP8 weights need"):
        d.check_package({"dense", "fp8", "int4"}, torch.bfloat16, A100)


def test_unknown_format_and_dtype_are_named():
    from vsr.runtime.errors import PackageError
    with pytest.raises(PackageError, match="'mxfp4'"):
        d.check_package({"mxfp4"}, torch.float32, CPU)
    with pytest.raises(PackageError, match="'float64x'"):
        d.check_package({"dense"}, "float64x", CPU)


def test_describe_reports_each_format():
    out = d.describe(H200, probes=ALL_SOFTWARE)
    assert out["device"]["compute_capability"] == "9.0"
    assert out["device"]["arch"] == "sm_90"
    assert out["table_row"].startswith("NVIDIA Ada, Hopper")
    f = out["formats"]
    assert f["dense"]["status"] == f["bf16"]["status"] == f["fp8"]["status"] == "runs"
    assert f["int4"] == {"status": "runs", "note": "with the fused kernel"}
    assert f["nvfp4"]["status"] == "refused" and d.MISSING_FP4_CORES in f["nvfp4"]["reason"]
    assert "emulation" in f["nvfp4"]

    cpu = d.describe(CPU, probes=ALL_SOFTWARE)["formats"]
    assert cpu["int4"] == {"status": "not measured"}
    assert cpu["fp8"]["status"] == "refused" and cpu["fp8"]["reason"].startswith("FP8 weights need")
    assert d.describe(RX7900, probes=ALL_SOFTWARE)["formats"]["int4"]["status"] == "not validated"
    v100 = d.describe(V100, probes=ALL_SOFTWARE)["formats"]
    assert v100["dense"]["status"] == "runs" and v100["bf16"]["status"] == "refused"
    assert d.BF16_RULE in v100["bf16"]["reason"]


def test_probe_software_matches_this_install():
    p = d.probe_software()
    assert p.torch_fp4 == hasattr(torch, "float4_e2m1fn_x2")
    import triton.language as tl
    assert p.triton and p.dot_scaled == hasattr(tl, "dot_scaled")
