"""The autotune cache key: defined once, here.

A key names everything a recorded tile depends on (issue 5 point 1): the device
identity (vendor, name, compute capability or gfx arch, multiprocessor count),
the Triton version, the template's name and source hash, the format parameters,
N, K, the row bucket and the activation dtype. Two problems that differ in any
of these never share a tile. The canonical form is sorted, compact JSON; its
sha256 prefix is the row id in the store.
"""
from __future__ import annotations

import functools
import hashlib
import json
import sys
import types
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

import torch

from vsr.autotune import startup_memo
from vsr.autotune.device_id import DeviceIdentity
from vsr.kernels.template import TILE_CHOICE_MODULES, module_code_text

KEY_FIELDS = ("device", "triton", "template", "source_hash", "params", "N", "K", "bucket", "act_dtype")


def triton_version() -> str:
    import triton
    return triton.__version__


def dtype_name(dtype: torch.dtype | str) -> str:
    """'bfloat16' for torch.bfloat16 (or the string as given, minus a 'torch.' prefix)."""
    return str(dtype).removeprefix("torch.")


def canonical_params(params: Any) -> str:
    """Format parameters (a tuple of (name, value) pairs or a dict) as sorted, compact JSON."""
    d = dict(params or ())
    return json.dumps(d, sort_keys=True, separators=(",", ":"))


@dataclass(frozen=True)
class CacheKey:
    device: str        # DeviceIdentity.key(): canonical JSON of the whole identity
    triton: str
    template: str
    source_hash: str
    params: str        # canonical JSON of the format parameters
    N: int
    K: int
    bucket: int
    act_dtype: str

    def as_dict(self) -> dict[str, Any]:
        # By hand: dataclasses.asdict deep-copies and dominated the load time of a shipped cache.
        return {"device": self.device, "triton": self.triton, "template": self.template,
                "source_hash": self.source_hash, "params": self.params, "N": self.N, "K": self.K,
                "bucket": self.bucket, "act_dtype": self.act_dtype}

    def canonical(self) -> str:
        """The one string form of the key: compact JSON, keys sorted."""
        c = self.__dict__.get("_canonical")
        if c is None:  # memoised: keys are immutable
            c = json.dumps(self.as_dict(), sort_keys=True, separators=(",", ":"))
            object.__setattr__(self, "_canonical", c)
        return c

    def digest(self) -> str:
        """Row id: sha256 of the canonical form (24 hex digits; collisions are not a practical concern)."""
        d = self.__dict__.get("_digest")
        if d is None:
            d = hashlib.sha256(self.canonical().encode()).hexdigest()[:24]
            object.__setattr__(self, "_digest", d)
        return d

    def lineage(self) -> "CacheKey":
        """This key less what a re-tune changes under it (the kernels' source hash, the Triton
        version): the same device, template, format, shape and bucket. An entry tuned for older
        kernels matches the current key's lineage."""
        return replace(self, source_hash="", triton="")

    @property
    def identity(self) -> DeviceIdentity:
        return DeviceIdentity.from_key(self.device)

    def short(self) -> str:
        """A human label for messages and progress lines (the digest disambiguates)."""
        ident = self.identity
        return (f"{ident.name}/{ident.arch} {self.template} N={self.N} K={self.K} "
                f"bucket={self.bucket} {self.act_dtype} [{self.digest()[:10]}]")

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "CacheKey":
        missing = [f.name for f in fields(cls) if f.name not in d]
        if missing:
            raise ValueError(f"cache key lacks field(s) {', '.join(missing)}: {d!r}")
        return cls(device=str(d["device"]), triton=str(d["triton"]), template=str(d["template"]),
                   source_hash=str(d["source_hash"]), params=str(d["params"]), N=int(d["N"]), K=int(d["K"]),
                   bucket=int(d["bucket"]), act_dtype=str(d["act_dtype"]))

    @classmethod
    def from_canonical(cls, s: str) -> "CacheKey":
        return cls.from_dict(json.loads(s))


@functools.lru_cache(maxsize=None)
def kernel_source_hash(template) -> str:
    """The template's source hash, extended by the vsr.kernels modules its module uses (shared
    kernels such as the split-K reduction live in kernels/common.py): a change to any of them
    changes the key, so a changed kernel never reuses old tiles. Memoised per template, not per
    module: two templates of one module may have other deps (templates are frozen dataclasses,
    hashed by their fields, so two that share a name never share a hash). Each module counts
    once: those the template's own hash covers (a KernelTemplate's: its module, common.py,
    gemm.py and its deps) are not added again, and those that only choose tiles
    (template.TILE_CHOICE_MODULES: gemm_tiles.py) are not added at all."""
    covered = {m.__name__ for m in template.modules} | {"vsr.kernels.template"} | TILE_CHOICE_MODULES
    deps = sorted({m.__name__ for m in vars(template.module).values()
                   if isinstance(m, types.ModuleType) and m.__name__.startswith("vsr.kernels.")
                   and m.__name__ not in covered})
    # The raw sources this hash derives from (and the code deriving it: template.py, this file)
    # stamp its memo, so a process whose kernels are unchanged skips the ast and tokenize passes.
    stamp = hashlib.sha256(template.name.encode())
    for m in [*template.modules, *(sys.modules[d] for d in deps), sys.modules["vsr.kernels.template"],
              sys.modules[__name__]]:
        stamp.update(_raw_source_digest(m.__name__, m.__file__).encode())
    return startup_memo.source_hash(stamp.hexdigest(), lambda: _source_hash(template, deps))


@functools.lru_cache(maxsize=None)
def _raw_source_digest(name: str, path: str) -> str:
    """sha256 of a module's name and file bytes, once per process (templates share modules)."""
    return hashlib.sha256(name.encode() + b"\0" + Path(path).read_bytes()).hexdigest()


def _source_hash(template, deps: list[str]) -> str:
    if not deps:
        h = template.source_hash
    else:
        hs = hashlib.sha256(template.source_hash.encode())
        for d in deps:
            hs.update(d.encode() + module_code_text(sys.modules[d]).encode())
        h = hs.hexdigest()[:16]
    return h


def make_key(template, problem, identity: DeviceIdentity, triton: str | None = None) -> CacheKey:
    """The key of `problem` solved by `template` on the device `identity` (Triton version: the installed one)."""
    return CacheKey(device=identity.key(), triton=triton or triton_version(), template=template.name,
                    source_hash=kernel_source_hash(template), params=canonical_params(problem.params),
                    N=int(problem.N), K=int(problem.K), bucket=int(problem.bucket),
                    act_dtype=dtype_name(problem.act_dtype))
