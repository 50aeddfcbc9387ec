"""The identity of a compute device, as the autotune cache keys it and the device table reads it.

Defined once here; runtime.device builds its capability table on top of it.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass

import torch


@dataclass(frozen=True)
class DeviceIdentity:
    vendor: str                      # "nvidia" | "amd" | "intel" | "cpu"
    name: str                        # e.g. "NVIDIA H200"
    capability: tuple[int, int] | None = None   # NVIDIA compute capability
    gfx_arch: str | None = None      # AMD, e.g. "gfx942" (no feature suffix)
    multiprocessors: int = 0         # SMs / CUs; CPU cores for the CPU

    @property
    def arch(self) -> str:
        """Short architecture tag: sm_90, gfx942, xpu, cpu."""
        if self.vendor == "nvidia" and self.capability:
            return f"sm_{self.capability[0]}{self.capability[1]}"
        if self.vendor == "amd" and self.gfx_arch:
            return self.gfx_arch
        return self.vendor if self.vendor in ("cpu", "intel") else "unknown"

    def key(self) -> str:
        """Canonical JSON used in cache keys: two devices that differ in any field never share a tile."""
        k = self.__dict__.get("_key")
        if k is None:  # memoised (the identity is immutable): resolving a key must stay cheap
            d = asdict(self)
            d["capability"] = list(self.capability) if self.capability else None
            k = json.dumps(d, sort_keys=True, separators=(",", ":"))
            object.__setattr__(self, "_key", k)
        return k

    @classmethod
    def from_key(cls, key: str) -> "DeviceIdentity":
        d = json.loads(key)
        d["capability"] = tuple(d["capability"]) if d.get("capability") else None
        return cls(**d)


def current_device_identity(device: str | torch.device | None = None) -> DeviceIdentity:
    """Read the identity of `device` (default: the current CUDA/ROCm GPU if any, else XPU, else CPU)."""
    dev = torch.device(device) if device is not None else None
    if dev is None:
        if torch.cuda.is_available():
            dev = torch.device("cuda", torch.cuda.current_device())
        elif hasattr(torch, "xpu") and torch.xpu.is_available():
            dev = torch.device("xpu", 0)
        else:
            dev = torch.device("cpu")
    if dev.type == "cuda":
        props = torch.cuda.get_device_properties(dev)
        if torch.version.hip is not None:
            gfx = getattr(props, "gcnArchName", "") .split(":")[0] or None
            return DeviceIdentity("amd", props.name, None, gfx, props.multi_processor_count)
        return DeviceIdentity("nvidia", props.name, (props.major, props.minor), None, props.multi_processor_count)
    if dev.type == "xpu":
        props = torch.xpu.get_device_properties(dev)
        return DeviceIdentity("intel", props.name, None, None, getattr(props, "gpu_subslice_count", 0))
    import os
    import platform
    return DeviceIdentity("cpu", platform.processor() or platform.machine(), None, None, os.cpu_count() or 1)
