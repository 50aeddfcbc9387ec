"""A package's engine run once at every batch shape of its ladder, so that Triton compiles every
kernel the package's forward launches on this device (vsr-tune compile --package).

The shapes are those runtime.engine.batch_shape gives for 1..BATCH_SIZE requests of 1..limit
tokens; the token ids are arbitrary (a kernel's compile depends on shapes, never on values).
"""
from __future__ import annotations

from vsr.runtime.engine import BATCH_SIZE, batch_shape, load_engine
from vsr.runtime.package import open_package

TOKEN_ID = 100   # inside every vocabulary vsr runs


def ladder_shapes(limit: int, max_requests: int = BATCH_SIZE) -> list[tuple[int, int]]:
    """Every (requests, tokens) batch shape of the engine's ladder up to the model's limit."""
    return sorted({batch_shape(n, t, limit) for n in range(1, max_requests + 1) for t in range(1, limit + 1)})


def package_jobs(name: str, cache: str | None, workers: int, device: str = "cuda") -> list[dict]:
    """The ladder of package `name` split into `workers` jobs for autotune.kernel_compile."""
    from vsr.runtime.tokenize import PackageTokenizer

    pkg = open_package(name, device=device, allow_unverified=True)
    shapes = ladder_shapes(PackageTokenizer(pkg.path, pkg.config).limit)
    return [{"run": f"{__name__}:run_package", "package": name, "cache": cache, "shapes": shapes[i::workers]}
            for i in range(workers) if shapes[i::workers]]


def run_package(job: dict, device) -> None:
    engine = load_engine(open_package(job["package"], device=str(device), allow_unverified=True),
                         device=str(device), autotune_cache=job.get("cache"))
    for n, length in job["shapes"]:
        engine._forward_ids([[TOKEN_ID] * length] * n)
