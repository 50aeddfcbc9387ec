"""`vsr-tune compile`: compile every kernel a cache (or a package) needs on this device, in parallel
processes, into a compiled-kernel bundle (autotune/bundle.py).

The entries of a bundle must be exactly what Triton's JIT looks up at run time on this device:
its key covers the kernel's specialization (which integer arguments are 1 or divisible by 16,
pointer alignment), the target and the Triton installation. So the kernels are not compiled from
a hand-made signature: each is launched, on this device, through the template's own launcher
with random data of the key's exact layout (autotune.synth), into an empty Triton cache dir that
becomes the bundle. Per cache entry (template, tile, N, K, bucket, activation dtype), the rows
launched are the bucket's own size and its smaller members that specialize otherwise
(rows_for_bucket). A job may instead name a function to run (`"run": "module:function"`): vsr-tune
names runtime.kernel_warmup.run_package, a package's engine at every batch shape of its ladder,
which also reaches the kernels outside the products.
"""
from __future__ import annotations

import json
import multiprocessing as mp
import os
from pathlib import Path

from vsr.autotune.buckets import bucket_for

_DT = ("float32", "float16", "bfloat16")


def rows_for_bucket(bucket: int) -> list[int]:
    """Row counts of `bucket` that Triton specializes apart: the bucket itself (1, or a multiple
    of 16 from 16 up), and its largest member that is neither (for buckets of 4 and more)."""
    rows = {bucket}
    for m in (bucket - 1, bucket // 2 + 1):
        if m > 1 and bucket_for(m) == bucket and m % 16 != 0:
            rows.add(m)
            break
    return sorted(rows)


def cache_jobs(store, identity, triton_version: str) -> tuple[list[dict], list[str], dict[str, str]]:
    """(jobs, cache key digests, template source hashes) for every entry of `store` recorded for
    this device and Triton whose kernel source is current (a stale entry is never read)."""
    from vsr.autotune.keys import kernel_source_hash
    from vsr.kernels.registry import TEMPLATES

    mine = identity.key()
    jobs, keys, hashes = [], [], {}
    for e in store.entries():
        k = e.key
        t = TEMPLATES.get(k.template)
        if k.device != mine or k.triton != triton_version or t is None or kernel_source_hash(t) != k.source_hash:
            continue
        if k.act_dtype not in _DT:
            continue
        hashes[t.name] = k.source_hash
        keys.append(e.digest)
        jobs.append({"template": k.template, "N": k.N, "K": k.K, "bucket": k.bucket, "act": k.act_dtype,
                     "params": json.loads(k.params), "tile": e.tile})
    return jobs, keys, hashes


def _run_cache_job(job: dict, device) -> None:
    import torch

    from vsr.autotune import synth
    from vsr.kernels.registry import TEMPLATES

    t = TEMPLATES[job["template"]]
    act = getattr(torch, job["act"])
    w = synth.random_weight(synth.weight_format(t.name), job["N"], job["K"], job["params"], act, device)
    for m in rows_for_bucket(job["bucket"]):
        t.launch(synth.random_activations(m, job["K"], act, device), w, dict(job["tile"]))


def _worker(args) -> int:
    jobs, device_index = args
    import torch
    device = torch.device("cuda", device_index)
    torch.cuda.set_device(device)
    for job in jobs:
        if "run" in job:   # "module:function" named by the caller (vsr-tune: a package's engine, in runtime)
            import importlib
            mod, fn = job["run"].split(":")
            getattr(importlib.import_module(mod), fn)(job, device)
        else:
            _run_cache_job(job, device)
    torch.cuda.synchronize()
    return len(jobs)


def compile_into(cache_dir: Path, jobs: list[dict], *, workers: int, device_index: int = 0, progress=None) -> None:
    """Run `jobs` in `workers` fresh processes whose Triton cache dir is `cache_dir` (empty: every
    kernel they launch is compiled and written there)."""
    cache_dir = Path(cache_dir)
    cache_dir.mkdir(parents=True, exist_ok=True)
    env_before = {k: os.environ.get(k) for k in ("TRITON_CACHE_DIR", "TRITON_CACHE_MANAGER", "VSR_KERNEL_BUNDLE")}
    os.environ["TRITON_CACHE_DIR"] = str(cache_dir)
    os.environ.pop("TRITON_CACHE_MANAGER", None)
    os.environ["VSR_KERNEL_BUNDLE"] = "off"   # the workers compile; they never read a bundle
    try:
        workers = max(1, min(workers, len(jobs)))
        chunks = [jobs[i::workers] for i in range(workers)]
        with mp.get_context("spawn").Pool(workers) as pool:
            done = 0
            for n in pool.imap_unordered(_worker, [(c, device_index) for c in chunks]):
                done += n
                if progress is not None:
                    progress(done, len(jobs))
    finally:
        for k, v in env_before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
