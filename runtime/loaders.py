"""Turning a package's safetensors into the kernels' weight objects (FORMATS.md §1, §4-§7).

`PackageLoader` opens `model.safetensors`, or the shards named by
`model.safetensors.index.json`, with safetensors only (never pickle) and reads a
tensor only when it is asked for. `check_linears` validates every tensor a set
of Linear layers needs (presence, dtype, shape) from the file headers alone, so
a broken package fails with the tensor's name before anything moves to a device.
Which tensors a layer of each format needs, and how they become its weight object, is the
format's spec (kernels/formats.py: check_tensors, load).
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Iterable

import torch
from safetensors import safe_open

from vsr.kernels import builtin_formats, formats
from vsr.runtime.errors import PackageError, read_json_object
from vsr.runtime.quant_config import Scheme, parse_quant_config

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"

FLOATS = builtin_formats.FLOATS
_TORCH_DTYPES = {
    "F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16, "F64": torch.float64,
    "F8_E4M3": torch.float8_e4m3fn, "I32": torch.int32, "I64": torch.int64, "U8": torch.uint8,
    "I8": torch.int8, "I16": torch.int16, "BOOL": torch.bool,
}


class PackageLoader:
    """Lazy, read-only access to a package's tensors (contract 3)."""

    def __init__(self, package_dir: Path, config: dict):
        self.dir = Path(package_dir)
        self.config = config
        self.quant = parse_quant_config(config)
        self._handles: dict[Path, object] = {}
        # Linear layer -> (format, N, K), once its tensors passed _check_linear; loading reuses
        # the dims (an int4 layer's are read from its weight_shape tensor).
        self._checked: dict[str, tuple[str, int, int]] = {}
        single = self.dir / SINGLE_FILE
        index = self.dir / INDEX_FILE
        # name -> file holding it; filled from the index, or from the single file's header.
        self._where: dict[str, Path] = {}
        if index.is_file():
            weight_map = read_json_object(index).get("weight_map")
            if not isinstance(weight_map, dict):
                raise PackageError(f"{index}: not a safetensors index (no weight_map object)")
            for name, fname in weight_map.items():
                path = self.dir / fname
                if not path.is_file():
                    raise PackageError(f"{index}: shard {fname!r} (holding {name!r}) is missing")
                self._where[name] = path
        elif single.is_file():
            for name in self._open(single).keys():
                self._where[name] = single
        else:
            raise PackageError(f"{self.dir}: no {SINGLE_FILE} and no {INDEX_FILE}")

    # -- raw tensors ---------------------------------------------------------------------------
    def _open(self, path: Path):
        h = self._handles.get(path)
        if h is None:
            try:
                h = safe_open(str(path), framework="pt", device="cpu")
            except Exception as e:  # safetensors raises its own error types for a bad header
                raise PackageError(f"{path}: not a readable safetensors file ({e})") from None
            self._handles[path] = h
        return h

    def keys(self) -> list[str]:
        return sorted(self._where)

    def has(self, name: str) -> bool:
        return name in self._where

    def _require(self, name: str) -> Path:
        path = self._where.get(name)
        if path is None:
            raise PackageError(f"{self.dir}: tensor {name!r} is missing")
        return path

    def tensor(self, name: str) -> torch.Tensor:
        """The tensor as stored, on the CPU."""
        path = self._require(name)
        try:
            return self._open(path).get_tensor(name)
        except Exception as e:
            raise PackageError(f"{path}: cannot read tensor {name!r} ({e})") from None

    def meta(self, name: str) -> tuple[str, tuple[int, ...]]:
        """(safetensors dtype string such as "F32", shape) from the header, reading no data."""
        path = self._require(name)
        sl = self._open(path).get_slice(name)
        return sl.get_dtype(), tuple(sl.get_shape())

    # -- per-layer schemes -----------------------------------------------------------------------
    def scheme_for(self, module_name: str) -> Scheme | None:
        return None if self.quant is None else self.quant.scheme_for(module_name)

    # -- validation --------------------------------------------------------------------------------
    def expect(self, name: str, dtypes: Iterable[str], shape: tuple[int, ...] | None,
               shape_text: str = "", numel: int | None = None) -> tuple[str, tuple[int, ...]]:
        """(dtype, shape) of tensor `name` from its header, or PackageError unless it has one of
        `dtypes` and the `shape` (or `numel` elements); `shape_text` is the shape as the error says it."""
        dtypes = tuple(dtypes)
        if not self.has(name):
            hint = ""
            base = name.rsplit(".", 1)[0]
            present = [k.rsplit(".", 1)[1] for k in self.keys() if k.startswith(base + ".")]
            if present:
                hint = f" (the layer has: {', '.join(present)}; does quantization_config match the file?)"
            raise PackageError(f"{self.dir}: tensor {name!r} is missing{hint}")
        dt, sh = self.meta(name)
        want_shape = shape_text or (list(shape) if shape is not None else "any")
        bad_shape = (shape is not None and sh != shape) or (numel is not None and math.prod(sh) != numel)
        if dt not in dtypes or bad_shape:
            raise PackageError(f"{self.dir}: tensor {name!r} expected dtype {'/'.join(dtypes)} shape {want_shape}, "
                               f"got dtype {dt} shape {list(sh)}")
        return dt, sh

    def _check_bias(self, m: str, N: int) -> None:
        if self.has(f"{m}.bias"):
            self.expect(f"{m}.bias", FLOATS, (N,), f"[N]=[{N}]")

    def _checked_linear(self, m: str) -> tuple[str, int, int]:
        """(format, N, K) of layer m, its tensors validated from the headers once: check_linears
        before loading, then linear() while loading, find it already done."""
        if m not in self._checked:
            self._checked[m] = self._check_linear(m)
        return self._checked[m]

    def _check_linear(self, m: str) -> tuple[str, int, int]:
        s = self.scheme_for(m)
        fmt = "dense" if s is None else s.format
        try:
            N, K = formats.get(fmt).check_tensors(self, m, s)
        except ValueError as e:
            raise PackageError(f"{self.dir}: {e}") from None
        self._check_bias(m, N)
        return fmt, N, K

    def check_linears(self, names: Iterable[str]) -> dict[str, str]:
        """Validate every named Linear layer before any loads; returns {name: format}."""
        return {m: self._checked_linear(m)[0] for m in names}

    # -- weight objects ----------------------------------------------------------------------------
    def _bias(self, m: str) -> torch.Tensor | None:
        return self.tensor(f"{m}.bias") if self.has(f"{m}.bias") else None

    def linear(self, m: str):
        """The kernels' weight object for Linear layer `m` (CPU tensors, as stored)."""
        fmt, N, K = self._checked_linear(m)
        try:
            return formats.get(fmt).load(self, m, self.scheme_for(m), N, K, self._bias(m))
        except ValueError as e:
            raise PackageError(f"{self.dir}: {e}") from None

    def close(self) -> None:
        self._handles.clear()
