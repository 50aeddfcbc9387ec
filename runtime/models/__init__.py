"""Plain-torch models built from a package's config.json: a BERT encoder and a Qwen3 classifier.

Every Linear layer is a vsr.runtime.linear.QLinear over the weight object
vsr.runtime.loaders.PackageLoader gives for it; nothing here knows a format.
"""
from __future__ import annotations

from vsr.runtime.errors import PackageError
from vsr.runtime.models.common import Builder


def build_model(config: dict, builder: Builder):
    """The model class for config.json's architecture, with its weights loaded through `builder`."""
    arch = (config.get("architectures") or [None])[0]
    mtype = config.get("model_type")
    if mtype == "bert" or (arch or "").startswith("Bert"):
        if arch not in (None, "BertModel") and not config.get("vsr_classifier"):
            # e.g. BertForSequenceClassification: a [CLS]-pooler head we do not run. Answering
            # with the embedding instead would silently drop the package's own head.
            raise PackageError(f"config.json: architecture {arch!r} is not supported; BERT packages are "
                               "encoders (BertModel) with an optional vsr_classifier head")
        from vsr.runtime.models.bert import BertRouter

        return BertRouter(config, builder)
    if mtype == "qwen3" or (arch or "").startswith("Qwen3"):
        if arch not in (None, "Qwen3ForSequenceClassification"):
            raise PackageError(f"config.json: architecture {arch!r} is not supported; Qwen3 packages must be "
                               "Qwen3ForSequenceClassification (a router with a score head)")
        from vsr.runtime.models.qwen3 import Qwen3Router

        return Qwen3Router(config, builder)
    raise PackageError(f"config.json: model_type {mtype!r} / architecture {arch!r} is not supported "
                       "(supported: bert encoders, Qwen3ForSequenceClassification)")
