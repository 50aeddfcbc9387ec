"""What every model needs from a package: linear layers and plain tensors, on a device, in a dtype."""
from __future__ import annotations

import torch

from vsr.runtime.linear import to_run_dtype


class Builder:
    """Hands models their weights.

    loader: a vsr.runtime.loaders.PackageLoader (cpu tensors, as stored).
    make_linear(weight) -> nn.Module: wraps a weight object (already on the device) in a QLinear.
    act_dtype: the activation dtype the model computes in.
    convert_dense: when True (an explicit --dtype), dense Linear weights are converted to act_dtype,
    so the same weights run in that precision; when False they stay as stored and are upcast per call.
    Quantized weights are never converted.
    """

    def __init__(self, loader, make_linear, act_dtype: torch.dtype, device, convert_dense: bool):
        self.loader = loader
        self.make_linear = make_linear
        self.act_dtype = act_dtype
        self.device = torch.device(device)
        self.convert_dense = convert_dense
        self.linear_bytes = 0
        self.other_bytes = 0
        self.linears: dict[str, torch.nn.Module] = {}

    def linear(self, name: str) -> torch.nn.Module:
        w = self.loader.linear(name)
        if self.convert_dense:
            w = to_run_dtype(w, self.act_dtype)  # dense only; quantized weights stay as stored
        w = w.to(self.device)
        self.linear_bytes += w.nbytes()
        self.linears[name] = self.make_linear(w)
        return self.linears[name]

    def tensor(self, name: str, dtype: torch.dtype | None = None) -> torch.Tensor:
        """A plain tensor (embedding, norm, head), in `dtype` if given, else as stored."""
        t = self.loader.tensor(name)
        if dtype is not None:
            t = t.to(dtype)
        t = t.to(self.device)
        self.other_bytes += t.numel() * t.element_size()
        return t

    def has(self, name: str) -> bool:
        return self.loader.has(name)
