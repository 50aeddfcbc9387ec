"""Reading a package's `quantization_config` (compressed-tensors) from config.json alone.

The block is parsed leniently, as FORMATS.md §2 says: QuantizationArgs keys take
their library defaults when missing (files written by ct 0.20 leave nulls out),
a missing `strategy` is inferred from `group_size`, unknown keys are ignored and
dtypes are strings such as "torch.float8_e4m3fn". Each config group is then
classified into one of the registered weight formats (kernels/formats.py: the format whose
spec lists the group's storage format, and whose check_scheme accepts its arguments); anything
vsr cannot run exactly is refused here, by group name, before a weight is read.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Iterable

from vsr.runtime.errors import PackageError


def _supported_storage() -> dict[str, str]:
    """compressed-tensors storage format -> the registered weight format that holds it."""
    from vsr.kernels import formats   # (on first need: config.json is read before any kernel loads)
    return {st: spec.name for spec in formats.FORMATS.values() for st in spec.storage}


# Storage formats the library knows but vsr does not run: named in the error so the user sees why.
_KNOWN_UNSUPPORTED_STORAGE = {
    "naive-quantized", "int-quantized", "dense", "mxfp4-pack-quantized", "mxfp6-pack-quantized",
    "mxfp8-quantized", "marlin-24", "sparse-24-bitmask", "sparse-bitmask",
}

_STRATEGIES = ("tensor", "channel", "group", "block", "token", "tensor_group", "attn_head")


@dataclass(frozen=True)
class QArgs:
    """One QuantizationArgs block with the library's defaults filled in."""

    num_bits: int = 8
    type: str = "int"
    symmetric: bool = True
    group_size: int | None = None
    strategy: str = "tensor"
    block_structure: tuple[int, ...] | None = None
    dynamic: bool | str = False
    actorder: str | None = None
    scale_dtype: str | None = None
    zp_dtype: str | None = None

    @classmethod
    def parse(cls, raw: Any, where: str) -> "QArgs | None":
        if raw is None:
            return None
        if not isinstance(raw, dict):
            raise PackageError(f"{where}: expected a QuantizationArgs object, got {raw!r}")
        group_size = raw.get("group_size")
        strategy = raw.get("strategy")
        if strategy is None:
            # The library infers it: no group size -> tensor, -1 -> channel, > 0 -> group.
            strategy = "tensor" if group_size is None else ("channel" if group_size == -1 else "group")
        strategy = str(strategy).lower()
        if strategy not in _STRATEGIES:
            raise PackageError(f"{where}: unknown quantization strategy {strategy!r}")
        dynamic = raw.get("dynamic", False)
        if isinstance(dynamic, str):
            dynamic = dynamic.lower()
            if dynamic in ("true", "false"):
                dynamic = dynamic == "true"
        actorder = raw.get("actorder")
        if actorder is True:  # legacy boolean spelling of "group"
            actorder = "group"
        elif actorder is False:
            actorder = None
        bs = raw.get("block_structure")
        try:
            return cls(
                num_bits=int(raw.get("num_bits", 8)),
                type=str(raw.get("type", "int")).lower(),
                symmetric=bool(raw.get("symmetric", True)),
                group_size=None if group_size is None else int(group_size),
                strategy=strategy,
                block_structure=None if bs is None else tuple(int(v) for v in bs),
                dynamic=dynamic,
                actorder=None if actorder is None else str(actorder).lower(),
                scale_dtype=_dtype_name(raw.get("scale_dtype")),
                zp_dtype=_dtype_name(raw.get("zp_dtype")),
            )
        except (TypeError, ValueError) as e:
            raise PackageError(f"{where}: malformed quantization arguments {raw!r}: {e}") from None


def _dtype_name(v: Any) -> str | None:
    """"torch.float8_e4m3fn" -> "float8_e4m3fn"; None stays None."""
    return None if v is None else str(v).removeprefix("torch.")


@dataclass(frozen=True)
class Scheme:
    """One config group, classified: `format` is ours, `storage` is compressed-tensors' name."""

    group: str
    format: str
    storage: str
    targets: tuple[str, ...]
    weights: QArgs | None  # None only for an unquantized ("dense") group
    input_activations: QArgs | None

    @property
    def group_size(self) -> int | None:
        return None if self.weights is None else self.weights.group_size

    @property
    def symmetric(self) -> bool:
        return True if self.weights is None else self.weights.symmetric

    @property
    def legacy_act_order(self) -> bool:
        """actorder "group" (alias "dynamic"): files written by ct <= 0.18 carry weight_g_idx."""
        return self.weights is not None and self.weights.actorder in ("group", "dynamic")


def _classify(group: str, storage: str, w: QArgs | None, a: QArgs | None, out: QArgs | None) -> str:
    """Our format for a group, or PackageError naming the group and what is unsupported."""
    where = f"quantization_config group {group!r}"
    if storage == "dense" and w is None and a is None and out is None:
        return "dense"  # the UNQUANTIZED preset: its layers keep plain weights
    supported = _supported_storage()
    if storage not in supported:
        kind = "unsupported" if storage in _KNOWN_UNSUPPORTED_STORAGE else "unknown"
        raise PackageError(f"{where}: {kind} compression format {storage!r} "
                           f"(supported: {', '.join(sorted(supported))})")
    if w is None:
        raise PackageError(f"{where}: format {storage!r} without a weights block is unsupported")
    if out is not None:
        raise PackageError(f"{where}: output activation quantization is unsupported")
    from vsr.kernels import formats
    fmt = supported[storage]
    try:
        formats.get(fmt).check_scheme(w, a)
    except ValueError as e:
        raise PackageError(f"{where}: {e}") from None
    return fmt


def _matches(entry: str, name: str, classes: Iterable[str]) -> str | None:
    """How `entry` matches module `name`: "exact", "regex", "class" or None (FORMATS.md §2)."""
    if entry == name:
        return "exact"
    if entry.startswith("re:"):
        return "regex" if re.match(entry[3:], name) else None
    return "class" if entry in classes else None


class QuantConfig:
    """A parsed quantization_config: its classified groups, ignore list and kv-cache scheme."""

    def __init__(self, raw: dict):
        if not isinstance(raw, dict):
            raise PackageError(f"config.json: quantization_config must be an object, got {type(raw).__name__}")
        method = raw.get("quant_method", "compressed-tensors")
        if method != "compressed-tensors":
            raise PackageError(f"config.json: quantization method {method!r} is unsupported "
                               "(only compressed-tensors packages are)")
        if raw.get("transform_config"):
            raise PackageError("config.json: a non-empty transform_config (Hadamard/rotation transforms) "
                               "is unsupported")
        sparsity = raw.get("sparsity_config")
        if sparsity and not isinstance(sparsity, dict):
            raise PackageError("config.json: quantization_config.sparsity_config must be an object")
        if sparsity and sparsity.get("format") not in (None, "dense"):
            raise PackageError(f"config.json: sparsity_config format {sparsity.get('format')!r} is unsupported")
        global_format = raw.get("format")
        groups = raw.get("config_groups") or {}
        if not isinstance(groups, dict):
            raise PackageError("config.json: quantization_config.config_groups must be an object")
        self.schemes: dict[str, Scheme] = {}
        for gname, g in groups.items():
            where = f"quantization_config group {gname!r}"
            if not isinstance(g, dict):
                raise PackageError(f"{where}: expected an object")
            targets = g.get("targets") or []
            if isinstance(targets, str):
                targets = [targets]
            storage = g.get("format") or global_format
            if storage is None or storage == "mixed-precision":
                raise PackageError(f"{where}: no compression format (neither the group's nor a global one)")
            w = QArgs.parse(g.get("weights"), f"{where} weights")
            a = QArgs.parse(g.get("input_activations"), f"{where} input_activations")
            o = QArgs.parse(g.get("output_activations"), f"{where} output_activations")
            fmt = _classify(gname, storage, w, a, o)
            self.schemes[gname] = Scheme(gname, fmt, storage, tuple(targets), w, a)
        ignore = raw.get("ignore") or []
        self.ignore: tuple[str, ...] = (ignore,) if isinstance(ignore, str) else tuple(ignore)
        # A quantized KV cache changes the attention's numbers (keys and values are rounded to
        # fp8 as they are cached); the models here never do that, so such a package is refused
        # rather than run with different numerics.
        if raw.get("kv_cache_scheme") is not None:
            kv = QArgs.parse(raw["kv_cache_scheme"], "quantization_config kv_cache_scheme")
            raise PackageError(f"quantization_config kv_cache_scheme: a quantized KV cache ({kv.type} {kv.num_bits}-bit, "
                               f"strategy {kv.strategy}) is not supported; vsr runs attention on unquantized keys and values")

    def scheme_for(self, module_name: str, classes: Iterable[str] = ("Linear", "Module")) -> Scheme | None:
        """The group that quantizes `module_name` (a Linear layer unless `classes` says otherwise),
        or None when it is ignored or no group targets it (it is then stored dense).
        `classes` are the class names in the module's MRO (a class-name target matches on any)."""
        classes = tuple(classes)
        if any(_matches(e, module_name, classes) for e in self.ignore):
            return None
        rank = {"exact": 0, "regex": 1, "class": 2}
        best: tuple[int, str, Scheme] | None = None
        for s in self.schemes.values():
            for t in s.targets:
                kind = _matches(t, module_name, classes)
                if kind is None:
                    continue
                cand = (rank[kind], t, s)
                # "<=": a target listed in two groups belongs to the later one, as in the library,
                # whose target -> scheme map is filled in group order.
                if best is None or cand[:2] <= best[:2]:
                    best = cand
        return None if best is None else best[2]

    def formats(self) -> set[str]:
        """Quantized formats of the groups, plus "dense" when some Linear layer may stay unquantized
        (an ignore list, or no group that targets every Linear layer)."""
        out = {s.format for s in self.schemes.values()}
        covers_all = any("Linear" in s.targets for s in self.schemes.values())
        if self.ignore or not covers_all:
            out.add("dense")
        return out


def parse_quant_config(config: dict) -> QuantConfig | None:
    """The package's QuantConfig, or None for a dense package (no quantization_config)."""
    raw = config.get("quantization_config")
    if raw is None:
        return None
    return QuantConfig(raw)


def package_formats(config: dict) -> set[str]:
    """The format names the package's Linear layers use, from config.json alone (contract 2)."""
    qc = parse_quant_config(config)
    return {"dense"} if qc is None else qc.formats()
