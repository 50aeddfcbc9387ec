"""WeightFormat: everything vsr knows about one weight format, in one object.

A format's spec names its weight class and pure-torch reference, its Triton templates and the
choice between them, how a Linear layer of it loads from a compressed-tensors package, the
synthetic weight the tuner times it on, and the record names (vsr-tune's --formats) it answers
to. kernels/formats.py holds the registry; the runtime, the autotuner and the CLI read the specs
from there and name no format themselves.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable

import torch

from vsr.kernels.template import Template


@dataclass(frozen=True)
class Record:
    """A record-format name (vsr-tune --formats, the cache's ls --json "format"): the format
    parameters of its synthetic weight, and whether it asks for the emulating template."""

    name: str
    params: tuple[tuple[str, Any], ...] = ()
    emulate: bool = False


@dataclass(frozen=True)
class WeightFormat:
    # The format's name: weight_class.format, and what quantization_config schemes classify to.
    name: str
    weight_class: type
    # reference(x [M, K], weight) -> y [M, N] in x's dtype: the format's exact numerics.
    reference: Callable[..., torch.Tensor]
    templates: tuple[Template, ...]
    # choose_template(weight, act_dtype, emulate) -> the name of the template that runs it; raises
    # (never falls back) where this device has no kernel for it.
    choose_template: Callable[..., str]
    # random_weight(N, K, params, model_dtype, generator, device) -> a weight of the format
    # parameters `params` (a dict, as Problem.params holds them), random values, never zeros.
    random_weight: Callable[..., Any]
    records: tuple[Record, ...]
    # Records vsr-tune tunes by default, and a shipped cache covers, on a device that runs the format.
    tuned_records: tuple[str, ...] = ()
    # record_label(template_name, params) -> the record name of a cache key (default: the first record).
    record_label: Callable[[str, dict], str] | None = None
    # compressed-tensors storage formats (a config group's "format") that hold this format.
    storage: tuple[str, ...] = ()
    # check_scheme(weights, input_activations) raises ValueError saying what a config group of this
    # storage asks that the format cannot run (QuantizationArgs as runtime.quant_config parses them).
    check_scheme: Callable[[Any, Any], None] | None = None
    # check_tensors(src, layer, scheme) -> (N, K): the layer's tensors checked from the headers alone;
    # load(src, layer, scheme, N, K, bias) -> the weight object (CPU tensors). `src` is the package
    # reader (runtime.loaders.PackageLoader: has, meta, tensor, expect); both raise ValueError for a
    # tensor that is not what the format needs.
    check_tensors: Callable[..., tuple[int, int]] | None = None
    load: Callable[..., Any] | None = None

    def label(self, template_name: str, params: dict) -> str:
        if self.record_label is not None:
            return self.record_label(template_name, params)
        return self.records[0].name

    def device_of(self, weight: Any) -> torch.device:
        """The device of the weight's first tensor field."""
        return getattr(weight, dataclasses.fields(weight)[0].name).device
