"""The registry of weight formats: one WeightFormat spec per format (kernels/weight_format.py).

`register(spec)` adds a format and its templates; everything else (the template choice, QLinear's
reference path, loading from a package, quantization_config's schemes, vsr-tune's records and
synthetic weights, the device table's format list) reads the specs from here.
"""
from __future__ import annotations

from typing import Any

from vsr.kernels.template import Template
from vsr.kernels.weight_format import Record, WeightFormat

FORMATS: dict[str, WeightFormat] = {}
# Every Triton template of a registered format, by name.
TEMPLATES: dict[str, Template] = {}


def register(spec: WeightFormat) -> WeightFormat:
    """Add a format. A name, template name or record name already taken by another format raises."""
    if spec.name in FORMATS and FORMATS[spec.name] is not spec:
        raise ValueError(f"weight format {spec.name!r} is registered already")
    if getattr(spec.weight_class, "format", None) != spec.name:
        raise ValueError(f"{spec.weight_class.__name__}.format must be {spec.name!r}")
    taken = {r.name for f in FORMATS.values() if f is not spec for r in f.records}
    for r in spec.records:
        if r.name in taken:
            raise ValueError(f"record format {r.name!r} of {spec.name!r} is another format's already")
    for t in spec.templates:
        if TEMPLATES.get(t.name, t) is not t:
            raise ValueError(f"template {t.name!r} of {spec.name!r} is registered already")
    FORMATS[spec.name] = spec
    TEMPLATES.update((t.name, t) for t in spec.templates)
    return spec


def unregister(name: str) -> None:
    """Remove a format and its templates (for tests that register a format of their own)."""
    spec = FORMATS.pop(name)
    for t in spec.templates:
        TEMPLATES.pop(t.name, None)


def get(name: str) -> WeightFormat:
    spec = FORMATS.get(name)
    if spec is None:
        raise ValueError(f"unknown weight format {name!r}; formats: {', '.join(FORMATS)}")
    return spec


def of(weight: Any) -> WeightFormat:
    """The spec of a weight object (by its class's `format`)."""
    return get(getattr(weight, "format", None))


def of_template(template_name: str) -> WeightFormat:
    """The format a template computes."""
    for spec in FORMATS.values():
        if any(t.name == template_name for t in spec.templates):
            return spec
    raise ValueError(f"no registered format has a template {template_name!r}")


def records() -> dict[str, tuple[WeightFormat, Record]]:
    """Every record-format name (vsr-tune --formats) -> (its format, the record)."""
    return {r.name: (spec, r) for spec in FORMATS.values() for r in spec.records}


from vsr.kernels import builtin_formats  # noqa: E402  (it builds on weight_format only)

register(builtin_formats.DENSE)
register(builtin_formats.FP8)
register(builtin_formats.INT4)
register(builtin_formats.NVFP4)
