"""Turning a package's safetensors into the kernels' weight objects (FORMATS.md §1, §4-§7).

`PackageLoader` opens `model.safetensors`, or the shards named by
`model.safetensors.index.json`, with safetensors only (never pickle) and reads a
tensor only when it is asked for. `check_linears` validates every tensor a set
of Linear layers needs (presence, dtype, shape) from the file headers alone, so
a broken package fails with the tensor's name before anything moves to a device.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Iterable

import torch
from safetensors import safe_open

from vsr.kernels.dense import DenseWeight
from vsr.kernels.fp8 import Fp8Weight
from vsr.kernels.int4 import Int4Weight, pack_int4, unpack_int4
from vsr.kernels.nvfp4 import BLOCK as NVFP4_BLOCK
from vsr.kernels.nvfp4 import Nvfp4Weight
from vsr.runtime.errors import PackageError, read_json_object
from vsr.runtime.quant_config import Scheme, parse_quant_config

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"

FLOATS = ("F32", "BF16", "F16")
_TORCH_DTYPES = {
    "F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16, "F64": torch.float64,
    "F8_E4M3": torch.float8_e4m3fn, "I32": torch.int32, "I64": torch.int64, "U8": torch.uint8,
    "I8": torch.int8, "I16": torch.int16, "BOOL": torch.bool,
}


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


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
    def _expect(self, name: str, dtypes: Iterable[str], shape: tuple[int, ...] | None,
                shape_text: str = "", numel: int | None = None) -> tuple[str, tuple[int, ...]]:
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
            self._expect(f"{m}.bias", FLOATS, (N,), f"[N]=[{N}]")

    def _int4_dims(self, m: str) -> tuple[int, int]:
        """(N, K) of an int4 layer, validated against weight_packed and weight_shape."""
        dt, sh = self._expect(f"{m}.weight_packed", ("I32",), None, "[N, ceil(K/8)]")
        if len(sh) != 2:
            raise PackageError(f"{self.dir}: tensor {m + '.weight_packed'!r} expected 2 dims [N, ceil(K/8)], "
                               f"got shape {list(sh)}")
        self._expect(f"{m}.weight_shape", ("I64", "I32"), None, "[2]", numel=2)
        N, K = (int(v) for v in self.tensor(f"{m}.weight_shape").reshape(-1).tolist())
        if N != sh[0] or _cdiv(K, 8) != sh[1]:
            raise PackageError(f"{self.dir}: tensor {m + '.weight_packed'!r} expected shape [N, ceil(K/8)]="
                               f"[{N}, {_cdiv(K, 8)}] for weight_shape [{N}, {K}], got {list(sh)}")
        return N, K

    def _checked_linear(self, m: str) -> tuple[str, int, int]:
        """(format, N, K) of layer m, its tensors validated from the headers once: check_linears
        before loading, then linear() while loading, find it already done."""
        if m not in self._checked:
            self._checked[m] = self._check_linear(m)
        return self._checked[m]

    def _check_linear(self, m: str) -> tuple[str, int, int]:
        s = self.scheme_for(m)
        fmt = "dense" if s is None else s.format
        if fmt == "dense":
            _, sh = self._expect(f"{m}.weight", FLOATS, None, "[N, K]")
            if len(sh) != 2:
                raise PackageError(f"{self.dir}: tensor {m + '.weight'!r} expected 2 dims [N, K], got shape {list(sh)}")
            N, K = sh
        elif fmt == "fp8":
            _, sh = self._expect(f"{m}.weight", ("F8_E4M3",), None, "[N, K]")
            if len(sh) != 2:
                raise PackageError(f"{self.dir}: tensor {m + '.weight'!r} expected 2 dims [N, K], got shape {list(sh)}")
            N, K = sh
            self._expect(f"{m}.weight_scale", FLOATS, None, f"[N, 1]=[{N}, 1]", numel=N)
            if self.meta(f"{m}.weight_scale")[1] not in ((N, 1), (N,)):
                self._expect(f"{m}.weight_scale", FLOATS, (N, 1), f"[N, 1]=[{N}, 1]")
        elif fmt == "int4":
            N, K = self._int4_dims(m)
            ng = _cdiv(K, int(s.group_size))
            self._expect(f"{m}.weight_scale", FLOATS, (N, ng), f"[N, ceil(K/G)]=[{N}, {ng}]")
            if not s.symmetric:
                self._expect(f"{m}.weight_zero_point", ("I32",), (_cdiv(N, 8), ng),
                             f"[ceil(N/8), ceil(K/G)]=[{_cdiv(N, 8)}, {ng}]")
            if s.legacy_act_order or self.has(f"{m}.weight_g_idx"):
                self._expect(f"{m}.weight_g_idx", ("I32", "I64"), (K,), f"[K]=[{K}]")
        elif fmt == "nvfp4":
            _, sh = self._expect(f"{m}.weight_packed", ("U8",), None, "[N, K/2]")
            if len(sh) != 2 or (2 * sh[1]) % NVFP4_BLOCK:
                raise PackageError(f"{self.dir}: tensor {m + '.weight_packed'!r} expected shape [N, K/2] with "
                                   f"K % 16 == 0, got {list(sh)}")
            N, K = sh[0], 2 * sh[1]
            self._expect(f"{m}.weight_scale", ("F8_E4M3",), (N, K // NVFP4_BLOCK), f"[N, K/16]=[{N}, {K // 16}]")
            self._expect(f"{m}.weight_global_scale", ("F32",), None, "[1]", numel=1)
            if s.input_activations is not None:
                self._expect(f"{m}.input_global_scale", ("F32",), None, "[1]", numel=1)
        else:  # pragma: no cover - quant_config only produces the formats above
            raise PackageError(f"{m}: unknown format {fmt!r}")
        self._check_bias(m, N)
        return fmt, N, K

    def check_linears(self, names: Iterable[str]) -> dict[str, str]:
        """Validate every named Linear layer before any loads; returns {name: format}."""
        return {m: self._checked_linear(m)[0] for m in names}

    # -- weight objects ----------------------------------------------------------------------------
    def _bias(self, m: str) -> torch.Tensor | None:
        return self.tensor(f"{m}.bias") if self.has(f"{m}.bias") else None

    def linear(self, m: str) -> DenseWeight | Fp8Weight | Int4Weight | Nvfp4Weight:
        """The kernels' weight object for Linear layer `m` (CPU tensors, as stored)."""
        fmt, N, K = self._checked_linear(m)
        s = self.scheme_for(m)
        if fmt == "dense":
            return DenseWeight(self.tensor(f"{m}.weight"), self._bias(m))
        if fmt == "fp8":
            w = self.tensor(f"{m}.weight")
            return Fp8Weight(w, self.tensor(f"{m}.weight_scale").reshape(w.shape[0]), self._bias(m))
        if fmt == "int4":
            return self._int4(m, s, N, K)
        igs = self.tensor(f"{m}.input_global_scale").reshape(1) if s.input_activations is not None else None
        return Nvfp4Weight(self.tensor(f"{m}.weight_packed"), self.tensor(f"{m}.weight_scale"),
                           self.tensor(f"{m}.weight_global_scale").reshape(1), igs, self._bias(m))

    def _int4(self, m: str, s: Scheme, N: int, K: int) -> Int4Weight:
        G = int(s.group_size)
        packed = self.tensor(f"{m}.weight_packed")
        scale = self.tensor(f"{m}.weight_scale")
        # Symmetric schemes have no zero point; a stray one is ignored (FORMATS.md pitfall 9).
        zero = None
        if not s.symmetric:
            # Packed along N (output channels), u-domain nibbles zu = zp + 8; trim the padding rows.
            zero = unpack_int4(self.tensor(f"{m}.weight_zero_point"), N, dim=0)
        perm = None
        if self.has(f"{m}.weight_g_idx"):
            perm = act_order_perm(self.tensor(f"{m}.weight_g_idx"), K, G, f"{m}.weight_g_idx")
            if torch.equal(perm, torch.arange(K)):
                perm = None  # groups already contiguous: no gather of x per call
        if perm is not None:
            # Permute the weight's columns once, here, so every group is contiguous: after the
            # permutation column j belongs to group j // G, which is what scale/zero already index.
            u = unpack_int4(packed, K)
            packed = pack_int4(u[:, perm])
        return Int4Weight(packed, scale, K, G, zero, perm, self._bias(m))

    def close(self) -> None:
        self._handles.clear()


def act_order_perm(g_idx: torch.Tensor, K: int, G: int, name: str = "weight_g_idx") -> torch.Tensor:
    """argsort(g_idx) (stable), after checking every group holds exactly G columns (the last one
    K - G*(groups-1)); the kernels rely on groups being contiguous runs of G columns."""
    g = g_idx.reshape(-1).to(torch.int64)
    ng = _cdiv(K, G)
    if g.numel() != K:
        raise PackageError(f"tensor {name!r}: expected {K} entries, got {g.numel()}")
    if int(g.min()) < 0 or int(g.max()) >= ng:
        raise PackageError(f"tensor {name!r}: group indices must lie in [0, {ng}), got [{int(g.min())}, {int(g.max())}]")
    counts = torch.bincount(g, minlength=ng)
    want = torch.full((ng,), G, dtype=counts.dtype)
    want[-1] = K - G * (ng - 1)
    if not torch.equal(counts, want):
        bad = int((counts != want).nonzero()[0])
        raise PackageError(f"tensor {name!r}: group {bad} has {int(counts[bad])} columns, expected {int(want[bad])} "
                           f"(group size {G})")
    return torch.argsort(g, stable=True)
