"""Which (Triton, ptxas) pairs leave the int4 register-operand kernels safe without a wait? No GPU.

    python benchmarks/rs_wgmma_hazards.py [--ptxas PATH ...] [--buckets 16,32,64,128,256,1024] [--out FILE]

The frag and SCALE_W join kernels give wgmma its left operand in registers (docs/kernels.md,
"int4_w4a16"). This compiles every such tile of the int4 space for the H200 (sm_90: the 27B-class
gate_up, GPTQ and AWQ, bf16, at each bucket) on this Triton, once as the launcher decides
(int4.mma_wait) and once with the wait forced off, and counts the kernels whose SASS writes a
register a pending wgmma still reads (kernels/wgmma_hazard.py). Each ptxas given runs in a process of
its own, named to Triton by TRITON_PTXAS_PATH and TRITON_PTXAS_BLACKWELL_PATH (Triton 3.6 assembles
sm_90 with the first, 3.9 with the second); without --ptxas, Triton's own. The exit status is 1 where
a kernel compiled as the launcher decides has such a write.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common_bench import code_commit  # noqa: E402
from sm90_fit import H200, Recorder  # noqa: E402

from vsr.autotune.synth import random_weight  # noqa: E402
from vsr.kernels import common, gemm, int4  # noqa: E402

N, K = 34816, 5120   # the 27B-class gate_up


def count(buckets: list[int]) -> dict:
    """This process's ptxas: its release, the launcher's decision, and per pass (launcher, unwaited)
    how many distinct frag and SCALE_W join kernels compiled and how many have such a write."""
    from triton.runtime.jit import JITFunction
    rec = Recorder(H200)
    JITFunction.__getitem__ = lambda fn, grid: (lambda *a, **k: rec.launch(fn, a, k))
    common.device_features = lambda device: H200.features
    gemm.multiprocessors = lambda device: H200.multiprocessors
    waits = int4.mma_wait(H200.features)
    t = int4.TEMPLATE
    passes = {}
    for label, wait in (("launcher", waits), ("unwaited", False)):
        int4.mma_wait = lambda dev, wait=wait: wait
        kernels = {}
        for symmetric in (True, False):
            w = random_weight("int4", N, K, {"bits": 4, "group": 128, "symmetric": symmetric, "act_order": False},
                              torch.bfloat16, "cpu")
            for bucket in buckets:
                x = torch.randn(bucket, K).bfloat16()
                for tile in t.search_space(t.problem(w, bucket, x.dtype)):
                    if tile["path"] == "frag" or (tile["path"] == "join" and tile.get("SCALE_W")):
                        rec.current = []
                        t.launch(x, w, tile)
                        for key in rec.current:
                            row = rec.compiled[key]
                            if row["kernel"] in ("_int4_frag_kernel", "_int4_join_kernel"):
                                kernels[key] = row
        passes[label] = {"kernels": len(kernels), "with_writes": sum(1 for r in kernels.values() if r["wgmma_hazards"]),
                         "rs_wgmma": sum(1 for r in kernels.values() if r["rs_wgmma"])}
    return {"ptxas": int4.ptxas_release(90), "mma_wait": waits, **passes}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ptxas", nargs="+", default=[None], help="ptxas binaries to assemble with (default: Triton's)")
    ap.add_argument("--buckets", default="16,32,64,128,256,1024")
    ap.add_argument("--out", default=None, help="JSON of every ptxas's counts")
    ap.add_argument("--one", action="store_true", help=argparse.SUPPRESS)   # a child: this process's ptxas
    a = ap.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET") == "1":
        ap.error("unset TRITON_INTERPRET: the kernels must compile, not be interpreted")
    buckets = [int(b) for b in a.buckets.split(",")]
    if a.one:
        print(json.dumps(count(buckets)))
        return 0
    t0, rows = time.time(), []
    for path in a.ptxas:
        env = dict(os.environ)
        if path is not None:
            ptxas = str(Path(path).resolve())
            env.update(TRITON_PTXAS_PATH=ptxas, TRITON_PTXAS_BLACKWELL_PATH=ptxas)
        p = subprocess.run([sys.executable, __file__, "--one", "--buckets", a.buckets], env=env,
                           capture_output=True, text=True)
        if p.returncode != 0:
            print(p.stderr[-3000:], file=sys.stderr)
            return 2
        row = dict(json.loads(p.stdout.strip().splitlines()[-1]), ptxas_path=path)
        rows.append(row)
        print(f"Triton {triton.__version__}, ptxas {row['ptxas']}: launcher waits {row['mma_wait']}; writes in "
              f"{row['launcher']['with_writes']} of {row['launcher']['kernels']} kernels as launched, "
              f"{row['unwaited']['with_writes']} of {row['unwaited']['kernels']} without the wait", flush=True)
    if a.out:
        Path(a.out).write_text(json.dumps(dict(benchmark="rs-wgmma-hazards", device=H200.name, commit=code_commit(),
                                               triton=triton.__version__, torch=torch.__version__, shape=[N, K],
                                               buckets=buckets, rows=rows, wall_s=round(time.time() - t0, 1)),
                                          indent=1))
    return 1 if any(r["launcher"]["with_writes"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
