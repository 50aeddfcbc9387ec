"""Plain-torch models built from a package's config.json: BERT and ModernBERT encoders, Qwen3 and
Qwen3.5 (hybrid Gated DeltaNet) classifiers.

Every Linear layer is a vsr.runtime.linear.QLinear over the weight object
vsr.runtime.loaders.PackageLoader gives for it; nothing here knows a format.
"""
from __future__ import annotations

from vsr.runtime.errors import PackageError
from vsr.runtime.models.common import Builder

# model_type -> family; a config without model_type is placed by its architecture's name.
_MODEL_TYPES = {"bert": "bert", "qwen3": "qwen3", "qwen3_5_text": "qwen3_5", "qwen3_5": "qwen3_5",
                "modernbert": "modernbert"}
_ARCH_PREFIXES = (("Bert", "bert"), ("ModernBert", "modernbert"), ("Qwen3_5", "qwen3_5"), ("Qwen3For", "qwen3"))
SUPPORTED = ("BERT encoders (BertModel with a vsr_classifier head), ModernBertForSequenceClassification, "
             "Qwen3ForSequenceClassification, Qwen3_5TextForSequenceClassification")


def _family(config: dict) -> str:
    """The model family of config.json: its model_type when it has one, else its architecture's name.
    Anything else (Qwen3-Next, Qwen3-MoE, Qwen3.5-MoE, ...) is refused by name."""
    arch = (config.get("architectures") or [None])[0]
    mtype = config.get("model_type")
    family = _MODEL_TYPES.get(mtype) if mtype is not None else \
        next((f for p, f in _ARCH_PREFIXES if (arch or "").startswith(p)), None)
    if family is None:
        raise PackageError(f"config.json: model_type {mtype!r} / architecture {arch!r} is not supported "
                           f"(supported: {SUPPORTED})")
    return family


def _module(family: str):
    if family == "bert":
        from vsr.runtime.models import bert as m
    elif family == "qwen3":
        from vsr.runtime.models import qwen3 as m
    elif family == "modernbert":
        from vsr.runtime.models import modernbert as m
    else:
        from vsr.runtime.models import qwen3_5 as m
    return m


def linear_names(config: dict, loader) -> list[str]:
    """Every Linear layer (module name) the model of config.json runs, for validation and tuning."""
    return _module(_family(config)).linear_names(config, loader)


def products(config: dict, loader) -> list[tuple[str, tuple[str, ...]]]:
    """The products the model of config.json runs, in order: (label, the Linear layers fused into
    it, in output order; one name for an unfused product). What vsr-tune tunes for a package."""
    return _module(_family(config)).products(config, loader)


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
    if family == "modernbert":
        from vsr.runtime.models.modernbert import ModernBertRouter

        return ModernBertRouter(config, builder)
    if family == "qwen3_5":
        from vsr.runtime.models.qwen3_5 import Qwen3_5Router

        return Qwen3_5Router(config, builder)
    if arch not in (None, "Qwen3ForSequenceClassification"):
        raise PackageError(f"config.json: architecture {arch!r} is not supported; Qwen3 packages must be "
                           "Qwen3ForSequenceClassification (a router with a score head)")
    from vsr.runtime.models.qwen3 import Qwen3Router

    return Qwen3Router(config, builder)
