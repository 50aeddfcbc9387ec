"""The user cache directory, in one place: packages, intents and the built-in router all use it."""
from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """The user cache directory: VSR_CACHE_DIR, else ~/.cache/vsr."""
    env = os.environ.get("VSR_CACHE_DIR")
    return Path(env) if env else Path.home() / ".cache" / "vsr"
