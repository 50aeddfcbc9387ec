"""Record the built-in packages' reference answers (runtime/builtin/reference_answers/*.json).

    OMP_NUM_THREADS=2 python scripts/record_reference.py [PACKAGE ...] [--count 300]

For each built-in package (all six by default): build it (vsr.runtime.builtin.resolve),
open it on the CPU (FP8 and NVFP4 through the explicit emulation: the reference
numerics), run the fp32 reference path on ``--count`` test sentences taken at a
fixed stride of the test split, and write text, top choice and top-3
probabilities as the recording of the package's revision on this kind of CPU: it replaces
an earlier recording of both and joins the others (a build on another kind of CPU
calibrates the GPTQ, AWQ and NVFP4 siblings to other weights, a new revision, and the
FP8 and NVFP4 references, which quantize activations, round some values to other codes).
``self_check`` compares an engine against the recording of its package's revision.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from vsr.runtime import builtin
from vsr.runtime.device import cpu_model
from vsr.runtime.engine import load_engine
from vsr.runtime.errors import DeviceRefusal
from vsr.runtime.intents import load_split
from vsr.runtime.package import open_package


def reference_texts(count: int) -> list[str]:
    test = load_split()["test"]
    stride = len(test) / count
    return [test[int(i * stride)].text for i in range(count)]


def record(name: str, texts: list[str]) -> dict:
    try:
        pkg = open_package(name, device="cpu")
    except DeviceRefusal:
        pkg = open_package(name, device="cpu", emulate=True)  # the explicit emulation
    eng = load_engine(pkg, device="cpu", dtype="float32", emulate=pkg.support == "emulated")
    answers = eng.predict(texts, top_k=3)
    return {
        "revision": pkg.revision,
        "host": cpu_model(),
        "mode": eng.mode,
        "dtype": "float32",
        "torch": torch.__version__,
        "answers": [{"text": t, "choice": a["choice"], "top": a["top"]} for t, a in zip(texts, answers)],
    }


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("packages", nargs="*", default=list(builtin.BUILTINS))
    ap.add_argument("--count", type=int, default=300)
    args = ap.parse_args(argv)
    torch.set_num_threads(2)
    texts = reference_texts(args.count)
    builtin.REFERENCE_DIR.mkdir(parents=True, exist_ok=True)
    for name in args.packages:
        t0 = time.time()
        rec = record(name, texts)
        path = builtin.reference_path(name)
        others = [r for r in builtin.recordings(name) if (r["revision"], r["host"]) != (rec["revision"], rec["host"])]
        path.write_text(json.dumps({"package": name, "recordings": others + [rec]}, indent=1) + "\n")
        print(f"{name}: {len(texts)} answers ({rec['mode']}) -> {path} in {time.time() - t0:.0f}s", flush=True)


if __name__ == "__main__":
    main()
