"""The device table: which package formats a device runs, refuses, or runs unmeasured.

The table is the seeds' "Quantization support by hardware and model" table,
kept here as data (DEVICE_TABLE) so that every row is testable without the
hardware: `check_package` and `describe` take a DeviceIdentity and, for NVFP4,
the software probes (a PyTorch with FP4 tensors, Triton with tl.dot_scaled) as
arguments.

A package the device cannot run is refused with the seeds' sentence, before any
weight is read; it is never loaded in BF16 instead. `emulate=True` is the
explicit opt-in to the reference numerics for a refused FP8 or NVFP4 package:
the support level is then "emulated" and every output must say so.
"""
from __future__ import annotations

import platform
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from vsr.autotune.device_id import DeviceIdentity
from vsr.runtime.errors import DeviceRefusal, PackageError

# Support levels, as check_package returns them and describe reports them.
YES = "yes"
NOT_MEASURED = "not measured"
NOT_VALIDATED = "not validated"
EMULATED = "emulated"
NO = "no"

# The formats the table has a column for (dense needs only BF16 where the package holds BF16).
TABLE_FORMATS = ("dense", "fp8", "int4", "nvfp4")

# ---- the seeds' sentences, word for word -----------------------------------------------
FP8_REFUSAL = ("FP8 weights need an NVIDIA GPU of compute capability 8.9 or later "
               "or an AMD Instinct MI300 or MI350 series GPU")
BF16_RULE = ("Decision 3.0 holds its weights in BF16 on a GPU, so a GPU without BF16 "
             "support runs none of its packages")
INT4_RULE = "int4 needs no special units: its layers unpack the weights to BF16 and multiply in BF16"
NVFP4_NEEDS = ("NVFP4 needs FP4 tensor cores, which only NVIDIA Blackwell GPUs have, a PyTorch "
               "with FP4 tensors, and Triton to quantize the activations")
MISSING_FP4_CORES = "FP4 tensor cores (an NVIDIA Blackwell GPU, compute capability 10.x or 12.x)"
MISSING_TORCH_FP4 = "a PyTorch with FP4 tensors (torch.float4_e2m1fn_x2)"
MISSING_TRITON = "Triton (importable, with tl.dot_scaled)"
EMULATE_HINT = "--emulate runs the reference numerics instead, labelled emulated"


@dataclass(frozen=True)
class Support:
    level: str          # YES | NO | NOT_MEASURED | NOT_VALIDATED
    note: str = ""      # the table's qualifier: "E4M3 FNUZ", "with the fused kernel", ...


@dataclass(frozen=True)
class DeviceRow:
    label: str                                  # the table's device column
    matches: Callable[[DeviceIdentity], bool]
    bf16: bool                                  # GPU with BF16 support (the CPU row: True)
    fp8: Support
    int4: Support
    nvfp4: Support
    gpu: bool = True


def _nv(pred: Callable[[int, int], bool]) -> Callable[[DeviceIdentity], bool]:
    return lambda d: d.vendor == "nvidia" and d.capability is not None and pred(*d.capability)


def _amd(pred: Callable[[str], bool]) -> Callable[[DeviceIdentity], bool]:
    return lambda d: d.vendor == "amd" and pred((d.gfx_arch or "").lower())


def _amd_has_bf16(arch: str) -> bool:
    # BF16 matrix instructions: CDNA 1-4 (gfx908, gfx90a, gfx94x, gfx950) and RDNA 3/4
    # (gfx11xx, gfx12xx). Vega (gfx900/906) and RDNA 1/2 (gfx10xx) have none.
    return arch in ("gfx908", "gfx90a") or arch.startswith(("gfx94", "gfx95", "gfx11", "gfx12"))


_FUSED = "with the fused kernel"
_no = Support(NO)

# First matching row wins. The rows marked "beyond the table" cover devices the seeds do
# not list; they run only what the seeds' rules allow (FP8 on CUDA from 8.9; int4 needs
# BF16) and say "not validated" where nobody measured them.
DEVICE_TABLE: tuple[DeviceRow, ...] = (
    DeviceRow("AMD Instinct MI300X, MI325X (gfx942)", _amd(lambda a: a == "gfx942"), True,
              Support(YES, "E4M3 FNUZ"), Support(YES), _no),
    DeviceRow("AMD Instinct MI350 series (gfx950)", _amd(lambda a: a == "gfx950"), True,
              Support(YES, "E4M3"), Support(YES), _no),
    DeviceRow("Other AMD GPUs with BF16", _amd(_amd_has_bf16), True,
              _no, Support(NOT_VALIDATED), _no),
    DeviceRow("AMD GPU without BF16 (beyond the table)", lambda d: d.vendor == "amd", False,
              _no, _no, _no),
    DeviceRow("NVIDIA Ampere (compute capability 8.0, 8.6)", _nv(lambda ma, mi: ma == 8 and mi < 9), True,
              _no, Support(YES, _FUSED), _no),
    DeviceRow("NVIDIA Ada, Hopper (compute capability 8.9, 9.0)",
              _nv(lambda ma, mi: (ma, mi) in ((8, 9), (9, 0))), True,
              Support(YES), Support(YES, _FUSED), _no),
    DeviceRow("NVIDIA Blackwell (compute capability 10.x, 12.x)", _nv(lambda ma, mi: ma in (10, 12)), True,
              Support(YES), Support(YES, _FUSED), Support(YES, "with Triton")),
    DeviceRow("NVIDIA GPU of compute capability 8.9 or later not in the table",
              _nv(lambda ma, mi: (ma, mi) >= (8, 9)), True,
              Support(YES), Support(NOT_VALIDATED), _no),
    DeviceRow("NVIDIA GPU before Ampere, without BF16 (beyond the table)", lambda d: d.vendor == "nvidia", False,
              _no, _no, _no),
    DeviceRow("Intel XPU (beyond the table)", lambda d: d.vendor == "intel", True,
              _no, Support(NOT_VALIDATED), _no),
    DeviceRow("CPU", lambda d: d.vendor == "cpu", True,
              _no, Support(NOT_MEASURED), _no, gpu=False),
)


@dataclass(frozen=True)
class Probes:
    """The software NVFP4 needs beside the FP4 tensor cores; injectable for tests."""
    torch_fp4: bool
    triton: bool
    dot_scaled: bool


def probe_software() -> Probes:
    """What this Python environment offers: torch's FP4 dtype, Triton and its tl.dot_scaled."""
    torch_fp4 = hasattr(torch, "float4_e2m1fn_x2")
    try:
        import triton.language as tl
    except Exception:  # noqa: BLE001 - a broken Triton install is as good as none for NVFP4
        return Probes(torch_fp4, False, False)
    return Probes(torch_fp4, True, hasattr(tl, "dot_scaled"))


def row_for(identity: DeviceIdentity) -> DeviceRow:
    for row in DEVICE_TABLE:
        if row.matches(identity):
            return row
    raise DeviceRefusal(f"{_device_words(identity)} is not a device vsr knows (vendor {identity.vendor!r}); "
                        "it runs on NVIDIA, AMD and Intel GPUs and on the CPU")


_DTYPE_NAMES = {
    "float32": torch.float32, "fp32": torch.float32, "float": torch.float32,
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
    "float16": torch.float16, "fp16": torch.float16, "half": torch.float16,
}


def parse_dtype(value: torch.dtype | str | None) -> torch.dtype:
    """A config's "dtype"/"torch_dtype" value as a torch dtype; absent means float32 (as in transformers)."""
    if value is None:
        return torch.float32
    if isinstance(value, torch.dtype):
        return value
    key = str(value).lower().removeprefix("torch.")
    if key not in _DTYPE_NAMES:
        raise PackageError(f"unknown model dtype {value!r}; expected one of float32, bfloat16, float16")
    return _DTYPE_NAMES[key]


def _device_words(identity: DeviceIdentity) -> str:
    if identity.vendor == "nvidia" and identity.capability:
        return f"{identity.name} (compute capability {identity.capability[0]}.{identity.capability[1]})"
    if identity.vendor == "amd":
        return f"{identity.name} ({identity.gfx_arch or 'unknown gfx arch'})"
    if identity.vendor == "cpu":
        return f"the CPU ({identity.name})" if identity.name else "the CPU"
    return identity.name or identity.vendor


def _bf16_refusal(identity: DeviceIdentity, what: str) -> str:
    return f"{what}, and {_device_words(identity)} has no BF16 support: {BF16_RULE}"


def _nvfp4_missing(row: DeviceRow, probes: Probes) -> list[str]:
    missing = []
    if row.nvfp4.level == NO:
        missing.append(MISSING_FP4_CORES)
    if not probes.torch_fp4:
        missing.append(MISSING_TORCH_FP4)
    if not (probes.triton and probes.dot_scaled):
        missing.append(MISSING_TRITON)
    return missing


def format_support(fmt: str, identity: DeviceIdentity, model_dtype: torch.dtype | str | None = None,
                   probes: Probes | None = None) -> tuple[str, str]:
    """(level, reason-or-note) for one format on one device; level NO comes with the refusal sentence."""
    level, why, _ = _support(fmt, identity, model_dtype, probes)
    return level, why


def device_formats(identity: DeviceIdentity) -> list[str]:
    """The record formats this device runs natively (the H200: bf16, fp8, int4-gptq, int4-awq), as the
    device table above says (the one place it lives: AMD gfx942/gfx950 run FP8 too). What vsr-tune
    tunes when no --formats is given, and what a shipped cache must cover."""

    from vsr.kernels import formats

    def runs(fmt: str) -> bool:
        return format_support(fmt, identity, "bfloat16")[0] != NO

    out = []
    for spec in formats.FORMATS.values():
        if spec.name == "dense":   # without BF16, dense weights are tuned in fp16
            out += list(spec.tuned_records) if runs("dense") else ["fp16"]
        elif spec.name in TABLE_FORMATS and runs(spec.name):
            out += list(spec.tuned_records)
    return out


def _support(fmt: str, identity: DeviceIdentity, model_dtype, probes) -> tuple[str, str, bool]:
    """(level, reason-or-note, whether the explicit emulation may lift a refusal)."""
    row = row_for(identity)
    dtype = parse_dtype(model_dtype)
    if fmt not in TABLE_FORMATS:
        raise PackageError(f"weight format {fmt!r} has no column in the device table (runtime/device.py); "
                           f"it has {', '.join(TABLE_FORMATS)}")
    if row.gpu and not row.bf16:
        # The reference numerics keep the package's dtype, so emulation cannot lift these.
        if dtype == torch.bfloat16:
            return NO, _bf16_refusal(identity, "This package holds its weights in BF16 (the Decision 3.0 class)"), False
        if fmt == "int4":
            return NO, _bf16_refusal(identity, f"Its int4 layers multiply in BF16 ({INT4_RULE})"), False
    if fmt == "dense":
        return YES, "", False
    if fmt == "fp8":
        s = row.fp8
        if s.level == NO:
            return NO, f"{FP8_REFUSAL}. This device is {_device_words(identity)}.", True
        return s.level, s.note, False
    if fmt == "int4":
        return row.int4.level, row.int4.note, False
    # nvfp4: name every missing piece, hardware and software.
    missing = _nvfp4_missing(row, probes if probes is not None else probe_software())
    if missing:
        return NO, (f"{NVFP4_NEEDS}. Missing here: " + "; ".join(missing)
                    + f". This device is {_device_words(identity)}."), True
    return row.nvfp4.level, row.nvfp4.note, False


_LEVEL_RANK = {YES: 0, NOT_MEASURED: 1, NOT_VALIDATED: 2}


def check_package(formats: set[str], model_dtype: torch.dtype | str | None, identity: DeviceIdentity,
                  emulate: bool = False, probes: Probes | None = None) -> str:
    """The support level of a package (its Linear formats and model dtype) on `identity`.

    Raises DeviceRefusal with the reason when the device cannot run it. With emulate=True
    (the explicit opt-in) the level is "emulated": the engine runs the reference numerics,
    which lifts the refusal of FP8 and NVFP4 but not a missing BF16 (the reference keeps the
    package's dtype) -- so a refusal that emulation cannot lift is still raised.
    """
    if not formats:
        raise PackageError("the package declares no weight format")
    refusals, levels = [], []
    for fmt in sorted(formats):
        level, why, liftable = _support(fmt, identity, model_dtype, probes)
        if level == NO:
            if emulate and liftable:
                continue
            refusals.append((fmt, why, liftable))
        else:
            levels.append(level)
    if refusals:
        fmt, why, liftable = refusals[0]
        if liftable and not emulate:
            why = f"{why} ({EMULATE_HINT})"
        raise DeviceRefusal(why)
    if emulate:
        return EMULATED
    return max(levels, key=_LEVEL_RANK.__getitem__)


def describe(identity: DeviceIdentity, probes: Probes | None = None) -> dict:
    """What `vsr-run --check-device` reports: the device and, per format, runs / refused / ..."""
    probes = probes if probes is not None else probe_software()
    row = row_for(identity)
    formats = {}
    # "bf16" is dense BF16 weights (the Decision 3.0 class); "dense" is FP32/FP16 weights.
    for key, fmt, dtype in (("dense", "dense", torch.float32), ("bf16", "dense", torch.bfloat16),
                            ("fp8", "fp8", torch.float32), ("int4", "int4", torch.float32),
                            ("nvfp4", "nvfp4", torch.float32)):
        level, why, liftable = _support(fmt, identity, dtype, probes)
        if level == NO:
            entry = {"status": "refused", "reason": why}
            if liftable:
                entry["emulation"] = "available with --emulate (reference numerics, labelled emulated)"
        else:
            entry = {"status": "runs" if level == YES else level}
            if why:
                entry["note"] = why
        formats[key] = entry
    return {
        "device": {
            "vendor": identity.vendor, "name": identity.name, "arch": identity.arch,
            "compute_capability": (f"{identity.capability[0]}.{identity.capability[1]}"
                                   if identity.capability else None),
            "gfx_arch": identity.gfx_arch, "multiprocessors": identity.multiprocessors,
        },
        "table_row": row.label,
        "bf16": row.bf16,
        "software": {"torch": torch.__version__, "torch_fp4": probes.torch_fp4,
                     "triton": _triton_version() if probes.triton else None,
                     "tl_dot_scaled": probes.dot_scaled},
        "formats": formats,
    }


def _triton_version() -> str | None:
    try:
        import triton
    except Exception:  # noqa: BLE001
        return None
    return getattr(triton, "__version__", "unknown")


def cpu_model() -> str:
    """This host's CPU model name (/proc/cpuinfo's, else platform.processor()): which kind of CPU
    a CPU figure or a recording was made on."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()
