"""The prefill attention kernel's key loop, timed alone at Qwen3's 27B-class heads (64 query and 8
key/value heads of 128, bf16, causal), CUDA graphs: each (requests x tokens) case in the form the
kernel ships (attention._config and SKIP_MASK_FROM) beside its alternatives, each checked against
attention_reference first:

- one:     one masked loop over 64-key blocks
- two:     the blocks every query of a program may see in an unmasked loop, then a masked loop
- one_n32: one masked loop over 32-key blocks (at most 256 tokens)
- one_m128: one masked loop over 32-key blocks, 128 queries a program on 8 warps (at most 256 tokens)
- two_n128: two loops over 128-key blocks (from 512 tokens)
- <form>_hf: each of these with the programs launched heads first (HEADS_FIRST_FROM)

Writes `attention-<device>-<date>.json`: rows {B, S, shipped: (BLOCK_N, two loops, heads first),
<form>_us for each form, err}; prints a table last.

    python benchmarks/bench_attention.py [--cases 1x128,16x128,...] [--out FILE]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common_bench import code_commit, graph_ms, result_path  # noqa: E402

from vsr.kernels import attention as A  # noqa: E402

CASES = "1x128,16x128,4x256,8x256,1x512,2x512,1x1024,1x2048"
HQ, HKV, D = 64, 8, 128
_SHIPPED_CONFIG = A._config


def forms(S: int) -> dict[str, dict]:
    """name -> what each form run at S tokens changes of the shipped one: block_n, and block_m with
    warps (_config), skip_from (SKIP_MASK_FROM), heads_first (HEADS_FIRST_FROM)."""
    one, two = {"skip_from": 10 ** 9}, {"skip_from": 1}
    out = {"one": dict(one, block_n=64), "two": dict(two, block_n=64)}
    if S <= 256:
        out["one_n32"] = dict(one, block_n=32)
        out["one_m128"] = dict(one, block_n=32, block_m=128, warps=8)
    if S >= 512:
        out["two_n128"] = dict(two, block_n=128)
    return {**{k: dict(v, heads_first=False) for k, v in out.items()},
            **{f"{k}_hf": dict(v, heads_first=True) for k, v in out.items()}}


def run_case(B: int, S: int, device) -> dict:
    # (fp16 under the Triton interpreter, whose bf16 tl.dot is wrong: the CPU test)
    dtype = torch.bfloat16 if torch.device(device).type == "cuda" else torch.float16
    qkv = torch.randn(B, S, HQ + 2 * HKV, D, device=device, dtype=dtype)
    q, k, v = qkv[:, :, :HQ], qkv[:, :, HQ:HQ + HKV], qkv[:, :, HQ + HKV:]
    lengths = torch.full((B,), S, dtype=torch.int32, device=device)
    ref = A.attention_reference(q, k, v, lengths, causal=True).float()
    shipped_cfg, shipped_from, shipped_hf = A._config(D, S), A.SKIP_MASK_FROM, A.HEADS_FIRST_FROM
    row = {"B": B, "S": S, "shipped": [shipped_cfg[1], S >= shipped_from, S >= shipped_hf], "err": {}}
    try:
        for name, f in forms(S).items():
            bm, _, warps, stages = shipped_cfg
            c = (f.get("block_m", bm), f["block_n"], f.get("warps", warps), stages)
            A._config = lambda D_, S_, f32="", c=c: c
            A.SKIP_MASK_FROM, A.HEADS_FIRST_FROM = f["skip_from"], 1 if f["heads_first"] else 10 ** 9
            fn = lambda: A.attention(q, k, v, lengths, causal=True)  # noqa: E731
            row["err"][name] = ((fn().float() - ref).abs().max() / ref.abs().max()).item()
            row[f"{name}_us"] = graph_ms([fn]) * 1e3
    finally:
        A._config, A.SKIP_MASK_FROM, A.HEADS_FIRST_FROM = _SHIPPED_CONFIG, shipped_from, shipped_hf
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", default=CASES, help="requests x tokens, comma-separated")
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_attention times CUDA graphs: it needs a GPU", file=sys.stderr)
        return 2
    dev = torch.device("cuda")
    torch.manual_seed(0)
    rows = [run_case(*map(int, c.split("x")), dev) for c in a.cases.split(",")]
    name = torch.cuda.get_device_name(dev)
    out = a.out or result_path("attention", name)
    out.write_text(json.dumps({"benchmark": "attention", "device": name, "torch": torch.__version__,
                               "commit": code_commit(), "heads": [HQ, HKV, D], "rows": rows}, indent=1))
    names = list(dict.fromkeys(n for c in a.cases.split(",") for n in forms(int(c.split("x")[1]))))
    print("| case | shipped | " + " | ".join(names) + " |\n|---|---|" + "---|" * len(names))
    for r in rows:
        cells = [f"{r[n + '_us']:.1f}" if n + "_us" in r else "-" for n in names]
        print(f"| {r['B']}x{r['S']} | {r['shipped'][0]} keys, {'two' if r['shipped'][1] else 'one'} loops"
              f"{', heads first' if r['shipped'][2] else ''} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
