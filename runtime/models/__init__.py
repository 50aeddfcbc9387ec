"""Plain-torch models built from a package's config.json: a BERT encoder and a Qwen3 classifier.

Every Linear layer is a vsr.runtime.linear.QLinear over the weight object
vsr.runtime.loaders.PackageLoader gives for it; nothing here knows a format.
"""
from __future__ import annotations

from vsr.runtime.errors import PackageError
from vsr.runtime.models.common import Builder


def _family(config: dict) -> str:
    """"bert" or "qwen3": the model family of config.json (model_type, else the architecture)."""
    arch = (config.get("architectures") or [None])[0]
    mtype = config.get("model_type")
    if mtype == "bert" or (arch or "").startswith("Bert"):
        return "bert"
    if mtype == "qwen3" or (arch or "").startswith("Qwen3"):
        return "qwen3"
    raise PackageError(f"config.json: model_type {mtype!r} / architecture {arch!r} is not supported "
                       "(supported: bert encoders, Qwen3ForSequenceClassification)")


def linear_names(config: dict, loader) -> list[str]:
    """Every Linear layer (module name) the model of config.json runs, for validation and tuning."""
    if _family(config) == "bert":
        from vsr.runtime.models import bert

        return bert.linear_names(config, loader)
    from vsr.runtime.models import qwen3

    return qwen3.linear_names(config, loader)


def products(config: dict, loader) -> list[tuple[str, tuple[str, ...]]]:
    """The products the model of config.json runs, in order: (label, the Linear layers fused into
    it, in output order; one name for an unfused product). What vsr-tune tunes for a package."""
    if _family(config) == "bert":
        from vsr.runtime.models import bert

        return bert.products(config, loader)
    from vsr.runtime.models import qwen3

    return qwen3.products(config, loader)


def build_model(config: dict, builder: Builder):
    """The model class for config.json's architecture, with its weights loaded through `builder`."""
    arch = (config.get("architectures") or [None])[0]
    family = _family(config)
    if family == "bert":
        if arch not in (None, "BertModel") and not config.get("vsr_classifier"):
            # e.g. BertForSequenceClassification: a [CLS]-pooler head we do not run. Answering
            # with the embedding instead would silently drop the package's own head.
            raise PackageError(f"config.json: architecture {arch!r} is not supported; BERT packages are "
                               "encoders (BertModel) with an optional vsr_classifier head")
        from vsr.runtime.models.bert import BertRouter

        return BertRouter(config, builder)
    if arch not in (None, "Qwen3ForSequenceClassification"):
        raise PackageError(f"config.json: architecture {arch!r} is not supported; Qwen3 packages must be "
                           "Qwen3ForSequenceClassification (a router with a score head)")
    from vsr.runtime.models.qwen3 import Qwen3Router

    return Qwen3Router(config, builder)
