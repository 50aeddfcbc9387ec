"""Row buckets: the one place they are defined.

A call with M rows runs the tile recorded for the smallest bucket >= M; M past
the last bucket uses the last bucket's tile.
"""
from __future__ import annotations

import bisect

ROW_BUCKETS: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)


def bucket_for(m: int) -> int:
    """The row bucket that M rows round up to."""
    if m < 1:
        raise ValueError(f"a call needs at least one row, got M={m}")
    i = bisect.bisect_left(ROW_BUCKETS, m)
    return ROW_BUCKETS[min(i, len(ROW_BUCKETS) - 1)]


def parse_buckets(spec: str) -> tuple[int, ...]:
    """Parse '1,16,256' or 'all' into buckets, refusing values that are not buckets."""
    if spec.strip() in ("", "all"):
        return ROW_BUCKETS
    out = []
    for part in spec.split(","):
        b = int(part)
        if b not in ROW_BUCKETS:
            raise ValueError(f"{b} is not a row bucket; buckets are {', '.join(map(str, ROW_BUCKETS))}")
        out.append(b)
    return tuple(sorted(set(out)))
