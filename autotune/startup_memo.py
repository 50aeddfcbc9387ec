"""Memos of the two hashes every fresh process would otherwise recompute before its first kernel.

- Triton's installation hash (`triton.runtime.cache.triton_key`, part of every compiled kernel's
  cache key, bundle lookups included): Triton reads and hashes libtriton.so (about 500 MB) and its
  compiler, backend and language sources, about 0.35 s on the H200's host. Memoised under a stamp
  of those same files (path, size, modification time: what Python's own bytecode cache trusts), so
  a reinstalled or edited Triton recomputes it. The memo is put in place as Triton's own compile
  pool does for its workers (`triton.runtime.cache.triton_key = lambda: key`).
- The kernels' source hashes (autotune.keys.kernel_source_hash: the code text of each kernel
  module, through ast and tokenize, about 0.15 s for a package's templates). Memoised under the
  sha256 of the modules' raw sources, so any edit recomputes it.

Both live in one JSON file under the user cache dir (`<root>/startup-memo.json`, written
atomically, a few KB); a missing, unreadable or foreign file is a miss, never an error.
`enable(root)` turns them on (the runtime does, before it loads an engine); without it nothing is
read or written.
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Callable

FILE = "startup-memo.json"
KIND = "vsr startup memo"
_KEEP = 16   # entries kept per memo: installs and kernel revisions a cache dir sees side by side

_STATE: dict = {"root": None, "doc": None, "triton_patched": False}


def enable(root: Path) -> None:
    """Read and write the memos under `root` (the user cache dir), and memoise triton_key."""
    root = Path(root)
    if _STATE["root"] != root:
        _STATE.update(root=root, doc=None)
    _memoise_triton_key()


def disable() -> None:
    """Stop reading and writing memos, and give Triton back its own triton_key."""
    _STATE.update(root=None, doc=None)
    if _STATE["triton_patched"]:
        import triton.runtime.cache as tcache
        tcache.triton_key = tcache.triton_key.original
        _STATE["triton_patched"] = False


def _doc() -> dict:
    if _STATE["doc"] is None:
        doc = {"kind": KIND, "triton_key": {}, "source_hash": {}}
        root = _STATE["root"]
        if root is not None:
            try:
                d = json.loads((root / FILE).read_text())
                if d.get("kind") == KIND and all(isinstance(d.get(k), dict) for k in ("triton_key", "source_hash")):
                    doc = d
            except (OSError, ValueError):
                pass
        _STATE["doc"] = doc
    return _STATE["doc"]


def _remember(memo: str, stamp: str, value: str) -> None:
    doc = _doc()
    entries = doc[memo]
    entries.pop(stamp, None)
    entries[stamp] = value
    while len(entries) > _KEEP:
        entries.pop(next(iter(entries)))
    root = _STATE["root"]
    if root is None:
        return
    try:
        root.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=root, prefix=".startup-memo-", suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            json.dump(doc, f, sort_keys=True)
        os.replace(tmp, root / FILE)
    except OSError:
        pass   # a read-only cache dir: the memo is this process's only


def recall(memo: str, stamp: str, compute: Callable[[], str]) -> str:
    """The value memoised under `stamp`, else compute() (then remembered)."""
    value = _doc()[memo].get(stamp) if _STATE["root"] is not None else None
    if value is None:
        value = compute()
        if _STATE["root"] is not None:
            _remember(memo, stamp, value)
    return value


# --- Triton's installation hash ----------------------------------------------------------------

def triton_install_stamp() -> str | None:
    """sha256 of the Triton version, Python's extension suffix and (relative path, size, mtime_ns)
    of every file triton_key reads: runtime/cache.py, the .py and .so files under compiler/,
    backends/ and language/, and _C/libtriton. None where the layout is not the expected one."""
    import sysconfig

    import triton
    base = Path(triton.__file__).resolve().parent
    ext = sysconfig.get_config_var("EXT_SUFFIX").split(".")[-1]
    lib = base / "_C" / f"libtriton.{ext}"
    files = [base / "runtime" / "cache.py", lib]
    if not all(f.is_file() for f in files):
        return None
    for sub in ("compiler", "backends", "language"):
        for dirpath, dirnames, filenames in os.walk(base / sub):
            dirnames.sort()
            files += [Path(dirpath) / f for f in sorted(filenames) if f.endswith((".py", ".so"))]
    h = hashlib.sha256(f"{triton.__version__}|{sys.version_info[:2]}|{ext}".encode())
    for f in files:
        st = f.stat()
        h.update(f"|{f.relative_to(base)}:{st.st_size}:{st.st_mtime_ns}".encode())
    return h.hexdigest()


def _memoise_triton_key() -> None:
    if _STATE["triton_patched"]:
        return
    try:
        import triton.runtime.cache as tcache
    except ImportError:
        return
    original = getattr(tcache, "triton_key", None)
    if not callable(original):
        return
    stamp = triton_install_stamp()
    if stamp is None:
        return
    memo: dict = {}

    def triton_key() -> str:
        if "key" not in memo:
            memo["key"] = recall("triton_key", stamp, original)
        return memo["key"]

    triton_key.original = original   # type: ignore[attr-defined]
    tcache.triton_key = triton_key
    _STATE["triton_patched"] = True


def source_hash(stamp: str, compute: Callable[[], str]) -> str:
    """A kernel source hash memoised under `stamp` (the sha256 of the raw sources it covers)."""
    return recall("source_hash", stamp, compute)
