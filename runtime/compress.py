"""Build quantized packages with llm-compressor (the optional extra `vsr[quant]`), contract 11.

compress_package(src_dir, out_dir, scheme, calibration_texts, seed=0) runs llm-compressor's
`oneshot` on a package folder and writes the compressed-tensors package to out_dir.
What FORMATS.md §10 found necessary, and why each step is here:
- one thread (torch.set_num_threads(1), OMP_NUM_THREADS=1) and shuffle_calibration_samples=False:
  the output is byte-identical on rebuild (and 10-30x faster on 2 busy cores);
- AWQ pins host memory for its grid search, which fails without an accelerator: the pinning
  is made a no-op while it runs on a machine without one;
- BERT has no built-in AWQ mapping; value -> attention.output.dense is the valid smoothing
  (the attention LayerNorm output is the residual stream: smoothing it wrecks the model);
- tokenizer files are copied verbatim (saving the tokenizer after calibration bakes in a truncation);
- heads are never quantized: "lm_head", "score", "classifier" (and BERT's unused pooler) are ignored.
A BERT package with a vsr_classifier head (the built-in router) is compressed as its encoder;
the head tensors and config keys are then put back, and model.safetensors is rewritten
deterministically with them.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
from pathlib import Path

import torch

from vsr.runtime.errors import PackageError, read_json_object

SCHEMES = ("FP8_DYNAMIC", "W4A16", "W4A16_ASYM", "NVFP4", "NVFP4-AWQ")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json",
                   "merges.txt", "vocab.json", "added_tokens.json", "chat_template.jinja", "sentence_bert_config.json")
IGNORE = ["lm_head", "score", "classifier", "re:.*pooler.*"]
HEAD_KEYS = ("vsr_classifier", "id2label", "label2id", "vsr_max_tokens")


def _require_llmcompressor():
    try:
        import llmcompressor  # noqa: F401
        from llmcompressor import oneshot
    except ImportError as e:
        raise PackageError("building quantized packages needs llm-compressor: pip install 'vsr[quant]' "
                           f"({e})") from e
    return oneshot


def _recipe(scheme: str, config: dict, model=None):
    from llmcompressor.modifiers.quantization import GPTQModifier, QuantizationModifier

    if scheme == "FP8_DYNAMIC":
        return [QuantizationModifier(targets=["Linear"], scheme="FP8_DYNAMIC", ignore=IGNORE)]
    if scheme == "W4A16":
        return [GPTQModifier(targets=["Linear"], scheme="W4A16", ignore=IGNORE)]
    if scheme == "NVFP4":
        return [QuantizationModifier(targets=["Linear"], scheme="NVFP4", ignore=IGNORE)]
    if scheme in ("W4A16_ASYM", "NVFP4-AWQ"):
        from llmcompressor.modifiers.transform.awq import AWQMapping, AWQModifier, default_mappings

        if config.get("model_type") == "bert":
            mappings = [AWQMapping("re:.*attention\\.self\\.value$", ["re:.*attention\\.output\\.dense$"])]
        elif config.get("model_type") == "qwen3":
            mappings = default_mappings
        elif config.get("model_type") == "qwen3_5_text" and model is not None:
            # llm-compressor's hybrid mappings (keyed there by the causal-LM class names): each
            # layer's input norm -> its mixer's input projections, post-attention norm -> MLP.
            from llmcompressor.modifiers.transform.awq.dynamic_mappings import build_hybrid_attention_mappings

            mappings = build_hybrid_attention_mappings(model)
        elif config.get("model_type") == "modernbert":
            # mlp_norm -> Wi (layer 0's attn_norm is an Identity, which AWQ cannot pair layer by layer).
            mappings = [AWQMapping("re:.*mlp_norm$", ["re:.*mlp\\.Wi$"])]
        else:
            raise PackageError(f"AWQ: no smoothing mapping for model_type {config.get('model_type')!r}")
        q = "W4A16_ASYM" if scheme == "W4A16_ASYM" else "NVFP4"
        return [AWQModifier(mappings=mappings),
                QuantizationModifier(targets=["Linear"], scheme=q, ignore=IGNORE)]
    raise PackageError(f"unknown compression scheme {scheme!r}; choose one of {', '.join(SCHEMES)}")


@contextlib.contextmanager
def _one_thread():
    old_threads, old_env = torch.get_num_threads(), os.environ.get("OMP_NUM_THREADS")
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(old_threads)
        if old_env is None:
            os.environ.pop("OMP_NUM_THREADS", None)
        else:
            os.environ["OMP_NUM_THREADS"] = old_env


@contextlib.contextmanager
def _no_pinning_without_accelerator():
    """AWQ pins cached activations for faster host->device copies; without a GPU pinning raises."""
    from llmcompressor.pipelines import cache

    if torch.accelerator.is_available():
        yield
        return
    orig = cache.IntermediatesCache.pin_memory
    cache.IntermediatesCache.pin_memory = lambda self, *a, **k: None
    try:
        yield
    finally:
        cache.IntermediatesCache.pin_memory = orig


def _load_model(src: Path, config: dict):
    from transformers import AutoModel, AutoModelForSequenceClassification

    dtype = config.get("dtype") or config.get("torch_dtype") or "float32"
    arch = (config.get("architectures") or [""])[0]
    if config.get("model_type") == "bert" and (config.get("vsr_classifier") or arch == "BertModel"):
        # The encoder alone; a vsr_classifier head is carried over unchanged afterwards.
        return AutoModel.from_pretrained(src, dtype=dtype)
    if arch.endswith("ForSequenceClassification"):
        return AutoModelForSequenceClassification.from_pretrained(src, dtype=dtype)
    raise PackageError(f"{src}/config.json: cannot compress architecture {arch!r} "
                       "(supported: BERT encoders, *ForSequenceClassification)")


def _calibration(src: Path, config: dict, texts: list[str]):
    from datasets import Dataset

    from vsr.runtime.tokenize import PackageTokenizer

    if not texts:
        raise PackageError("compress_package: calibration_texts is empty")
    tok = PackageTokenizer(src, config)
    ids = [x[: tok.limit] for x in tok.encode(list(texts))]
    return Dataset.from_dict({"input_ids": ids, "attention_mask": [[1] * len(x) for x in ids]}), \
        max(len(x) for x in ids)


def _restore_head(src: Path, out: Path, config: dict) -> None:
    """Put the vsr_classifier tensors and config keys back beside the compressed encoder."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    from vsr.runtime.loaders import PackageLoader

    head = PackageLoader(src, config)
    try:
        extra = {n: head.tensor(n).contiguous() for n in ("classifier.weight", "classifier.bias")}
    finally:
        head.close()
    files = sorted(out.glob("model*.safetensors"))
    if [f.name for f in files] != ["model.safetensors"]:
        raise PackageError(f"{out}: expected one model.safetensors, found {[f.name for f in files]}")
    with safe_open(files[0], "pt") as f:
        meta = f.metadata()
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    tensors.update(extra)
    save_file(dict(sorted(tensors.items())), files[0], metadata=meta or {"format": "pt"})
    cfg = json.loads((out / "config.json").read_text())
    for k in HEAD_KEYS:
        if k in config:
            cfg[k] = config[k]
    # The encoder alone was compressed, so its ignore list cannot name the head: say it here
    # (contract 12), so any reader matching "Linear" targets leaves the fp32 head alone.
    ignore = cfg.get("quantization_config", {}).get("ignore")
    if ignore is not None and "classifier" not in ignore:
        ignore.append("classifier")
    (out / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


def compress_package(src_dir, out_dir, scheme: str, calibration_texts: list[str], *, seed: int = 0) -> Path:
    """Compress the package at src_dir with `scheme` into out_dir (new or empty); returns out_dir."""
    if scheme not in SCHEMES:
        raise PackageError(f"unknown compression scheme {scheme!r}; choose one of {', '.join(SCHEMES)}")
    oneshot = _require_llmcompressor()
    src, out = Path(src_dir), Path(out_dir)
    config = read_json_object(src / "config.json")
    # Never write over something: a half-replaced package would pass for a whole one.
    if out.exists() and any(out.iterdir()):
        raise PackageError(f"{out}: the output folder exists and is not empty")
    out.mkdir(parents=True, exist_ok=True)
    with _one_thread():
        torch.manual_seed(seed)
        model = _load_model(src, config)
        ds, max_len = _calibration(src, config, calibration_texts)
        recipe = _recipe(scheme, config, model)
        with _no_pinning_without_accelerator():
            oneshot(model=model, dataset=ds, recipe=recipe, num_calibration_samples=len(ds),
                    shuffle_calibration_samples=False, max_seq_length=max_len, batch_size=1)
        model.save_pretrained(out, save_compressed=True, max_shard_size="100GB")
    for name in TOKENIZER_FILES:
        if (src / name).is_file():
            shutil.copyfile(src / name, out / name)
    if config.get("vsr_classifier"):
        _restore_head(src, out, config)
    return out
