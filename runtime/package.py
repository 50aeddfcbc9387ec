"""Packages: resolving a name, the device check, and the identity check against MODEL_MANIFEST.json.

A package is the folder llm-compressor writes (config.json, safetensors weights,
tokenizer files) plus MODEL_MANIFEST.json:

    {"name": ..., "revision": ..., "format": ...,
     "files": {"<relative path>": {"size": <bytes>, "sha256": "<hex>"}, ...}}

`open_package` works in a fixed order so that a device that cannot run a package
refuses it before any weight file is opened: resolve the name -> read config.json ->
device check -> identity check -> return. The weights are loaded later, by the engine.
"""
from __future__ import annotations

import hashlib
import json
import os
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from vsr.autotune.device_id import DeviceIdentity, current_device_identity
from vsr.runtime import device as device_table
from vsr.runtime.errors import DeviceRefusal, PackageError, read_json_object
from vsr.runtime.paths import cache_root as _cache_root

MANIFEST = "MODEL_MANIFEST.json"
CONFIG = "config.json"
_CHUNK = 8 << 20  # hash in 8 MiB pieces: a 50 GB shard never sits in memory

# The built-in siblings' name suffixes and the format each holds (the vllm-sr/d3 naming
# the seeds use). Only used to refuse a built-in package before it is built into the
# user cache (building a sibling means compressing weights); the real check reads its
# config.json once it exists.
_BUILTIN_SUFFIX_FORMAT = (("-NVFP4-AWQ", "nvfp4"), ("-NVFP4", "nvfp4"), ("-FP8", "fp8"),
                          ("-W4A16-GPTQ", "int4"), ("-W4A16-AWQ", "int4"))


@dataclass
class OpenedPackage:
    path: Path
    name: str
    revision: str | None
    formats: set[str]
    config: dict
    model_dtype: torch.dtype
    identity_status: str           # "verified" | "unverified"
    support: str                   # device check level: yes / not measured / not validated / emulated
    device: DeviceIdentity | None = None
    builtin: bool = False
    manifest: dict | None = field(default=None, repr=False)


# ---- manifest ---------------------------------------------------------------------------

# Hashing a 27B-class package (tens of GB) on every start would cost minutes, so the sha256
# of a large file is remembered per (real path, size, mtime_ns, ctime_ns, inode), as git's
# index does. Any write to a file changes its ctime, which no user-level call can set back,
# so a changed file is always hashed again. Small files are always hashed.
# A file changed within the filesystem's timestamp tick of the hash could keep all its stat
# fields ("racy git"), so files touched less than this long ago are never remembered.
HASH_CACHE_MIN_BYTES = 16 << 20
HASH_CACHE_SETTLE_NS = 2_000_000_000
_HASH_CACHE = "verified-sha256.json"


def _stat_key(path: Path, st: os.stat_result) -> str:
    return f"{os.path.realpath(path)}|{st.st_size}|{st.st_mtime_ns}|{st.st_ctime_ns}|{st.st_ino}"


def _load_hash_cache() -> dict:
    try:
        data = json.loads((_cache_root() / _HASH_CACHE).read_text())
    except (OSError, ValueError):
        return {}   # absent or unreadable: hash everything (the cache only saves time)
    return data if isinstance(data, dict) else {}


def _save_hash_cache(entries: dict) -> None:
    root = _cache_root()
    try:
        root.mkdir(parents=True, exist_ok=True)
        tmp = root / f".{_HASH_CACHE}.tmp-{os.getpid()}"
        tmp.write_text(json.dumps(entries, sort_keys=True))
        os.replace(tmp, root / _HASH_CACHE)   # atomic: a concurrent reader sees old or new
    except OSError:
        pass   # a read-only home still verifies packages; it only hashes them again next time


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _package_files(root: Path) -> dict[str, Path]:
    """Every file of the package folder but the manifest, by POSIX relative path."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root, followlinks=True):
        dirnames.sort()
        for fn in sorted(filenames):
            p = Path(dirpath, fn)
            rel = p.relative_to(root).as_posix()
            if rel != MANIFEST:
                out[rel] = p
    return out


def file_digests(package_dir: str | Path) -> dict[str, dict]:
    """{relative path: {"size", "sha256"}} for every file of the folder but the manifest."""
    return {rel: {"size": p.stat().st_size, "sha256": sha256_file(p)}
            for rel, p in _package_files(Path(package_dir)).items()}


def revision_of(files: dict[str, dict]) -> str:
    """sha256 over the (relative path, file sha256) pairs of file_digests, in path order."""
    h = hashlib.sha256()
    for rel in sorted(files, key=lambda r: r.split("/")):
        h.update(f"{rel}\0{files[rel]['sha256']}\n".encode())
    return h.hexdigest()


def write_manifest(package_dir: str | Path, name: str, format: str, *, revision: str | None = None) -> Path:
    """Write MODEL_MANIFEST.json for every file now in `package_dir`; returns its path.

    revision None: revision_of the files (hashed once, for both). Written to a temporary
    file and renamed, so a reader never sees half a manifest.
    """
    root = Path(package_dir)
    if not root.is_dir():
        raise PackageError(f"cannot write a manifest: {root} is not a folder")
    files = file_digests(root)
    if revision is None:
        revision = revision_of(files)
    manifest = {"name": name, "revision": revision, "format": format, "files": files}
    out = root / MANIFEST
    tmp = root / f".{MANIFEST}.tmp-{os.getpid()}"
    tmp.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, out)
    return out


def read_manifest(package_dir: str | Path) -> dict | None:
    """The parsed manifest, None when the folder has none; PackageError when it is malformed."""
    path = Path(package_dir) / MANIFEST
    if not path.exists():
        return None
    m = read_json_object(path)
    if not isinstance(m.get("files"), dict):
        raise PackageError(f"{path}: a manifest is an object with a \"files\" object")
    for key in ("name", "revision", "format"):
        if not isinstance(m.get(key), str):
            raise PackageError(f"{path}: the manifest has no {key!r} string")
    for rel, entry in m["files"].items():
        if not (isinstance(entry, dict) and isinstance(entry.get("size"), int)
                and isinstance(entry.get("sha256"), str)):
            raise PackageError(f"{path}: the entry for {rel!r} needs an integer size and a sha256")
    return m


def verify_manifest(package_dir: str | Path, manifest: dict) -> None:
    """Check every file against the manifest: none missing, none extra, none changed.

    Sizes are compared for every file first, so a truncated or grown file is named without
    hashing anything; then each file's sha256. Raises PackageError naming the file.
    """
    root = Path(package_dir)
    present = _package_files(root)
    listed = manifest["files"]
    missing = sorted(set(listed) - set(present))
    if missing:
        raise PackageError(f"{root}: file {missing[0]} is listed in {MANIFEST} but missing"
                           + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""))
    extra = sorted(set(present) - set(listed))
    if extra:
        raise PackageError(f"{root}: file {extra[0]} is not listed in {MANIFEST}: the package was changed"
                           + (f" (and {len(extra) - 1} more)" if len(extra) > 1 else ""))
    stats = {}
    for rel in sorted(listed):
        st = stats[rel] = os.stat(present[rel])
        if not stat.S_ISREG(st.st_mode):
            raise PackageError(f"{root}: {rel} is not a regular file")
        if st.st_size != listed[rel]["size"]:
            raise PackageError(f"{root}: file {rel} changed: {st.st_size} bytes, the manifest says "
                               f"{listed[rel]['size']}")
    # The remembered hashes are read only when some file is large enough to be remembered.
    big = any(st.st_size >= HASH_CACHE_MIN_BYTES for st in stats.values())
    cache = _load_hash_cache() if big else {}
    fresh = {}
    for rel in sorted(listed):
        p, st = present[rel], stats[rel]
        key = _stat_key(p, st) if st.st_size >= HASH_CACHE_MIN_BYTES else None
        digest = cache.get(key) if key else None
        if digest is None:
            digest = sha256_file(p)
            if key and time.time_ns() - max(st.st_mtime_ns, st.st_ctime_ns) > HASH_CACHE_SETTLE_NS:
                fresh[key] = digest
        if digest != listed[rel]["sha256"].lower():
            raise PackageError(f"{root}: file {rel} changed: its sha256 is {digest}, the manifest says "
                               f"{listed[rel]['sha256']}")
    if fresh:
        # Only hashes that matched the manifest are remembered.
        _save_hash_cache({k: v for k, v in {**cache, **fresh}.items() if os.path.exists(k.split("|", 1)[0])})


# ---- resolving and opening --------------------------------------------------------------

def _builtin_resolver():
    """vsr.runtime.builtin.resolve, or None while no built-in packages exist in this install."""
    try:
        from vsr.runtime import builtin
    except ImportError:
        return None, ()
    return builtin.resolve, tuple(getattr(builtin, "BUILTINS", ()))


def builtin_names() -> tuple[str, ...]:
    return _builtin_resolver()[1]


def _builtin_format_hint(name: str) -> set[str]:
    for suffix, fmt in _BUILTIN_SUFFIX_FORMAT:
        if name.endswith(suffix):
            return {fmt}
    return {"dense"}


def read_config(package_dir: Path) -> dict:
    path = package_dir / CONFIG
    if not path.is_file():
        raise PackageError(f"{package_dir}: no {CONFIG}: not a package folder")
    return read_json_object(path)


def model_dtype_of(config: dict) -> torch.dtype:
    """The model dtype: transformers 5 writes "dtype", older versions "torch_dtype"."""
    value = config.get("dtype", config.get("torch_dtype"))
    try:
        return device_table.parse_dtype(value)
    except PackageError as e:
        raise PackageError(f"{CONFIG}: {e}") from None


def device_identity(device=None) -> DeviceIdentity:
    """The identity of a torch device given by name (None: the default device), or a DeviceIdentity as is."""
    if isinstance(device, DeviceIdentity):
        return device
    try:
        return current_device_identity(device)
    except (RuntimeError, AssertionError, ValueError) as e:
        # torch says why: not a device name, or a CPU-only build asked for CUDA.
        raise DeviceRefusal(f"device {device!r} is not available here: {e}") from None


def open_package(name_or_path: str | Path, *, revision: str | None = None, allow_unverified: bool = False,
                 device=None, emulate: bool = False,
                 probes: device_table.Probes | None = None) -> OpenedPackage:
    """Resolve, device-check and identity-check a package; no weight file is read before the device check.

    `device` is a torch device (string or object), a DeviceIdentity (tests simulate devices
    this way), or None for the current default device. `probes` overrides the software
    probes of the NVFP4 check (tests).
    """
    from vsr.runtime.quant_config import package_formats  # lazy: the formats slice

    identity = device_identity(device)
    name = str(name_or_path)
    resolve, names = _builtin_resolver()
    is_builtin = resolve is not None and name in names
    if is_builtin:
        # Refuse a built-in sibling the device cannot run before it is built into the cache.
        device_table.check_package(_builtin_format_hint(name), torch.float32, identity, emulate, probes)
    path = resolve(name) if resolve is not None else None
    is_builtin = path is not None
    if path is None:
        path = Path(name_or_path).expanduser()
        if not path.is_dir():
            import difflib
            close = difflib.get_close_matches(name.lower(), [n.lower() for n in names], n=1, cutoff=0.8)
            maybe = f"; did you mean {names[[n.lower() for n in names].index(close[0])]}?" if close else ""
            raise PackageError(f"no package {name!r}: it is not a built-in package and there is no folder "
                               f"{path} (vsr-run --list shows the built-in packages){maybe}")
    path = Path(path)

    config = read_config(path)
    formats = package_formats(config)
    model_dtype = model_dtype_of(config)
    # The device check comes before the manifest is read and before any weight is hashed.
    support = device_table.check_package(formats, model_dtype, identity, emulate, probes)

    manifest = read_manifest(path)
    if manifest is None:
        if not allow_unverified:
            raise PackageError(f"{path} has no {MANIFEST}, so its identity cannot be checked; "
                               "--allow-unverified loads it anyway, reported unverified")
        if revision is not None:
            raise PackageError(f"revision {revision} was asked for, but {path} has no {MANIFEST} to "
                               "confirm any revision")
        return OpenedPackage(path, name if is_builtin else path.name, None, formats, config, model_dtype,
                             "unverified", support, identity, is_builtin, None)
    if revision is not None and revision != manifest["revision"]:
        raise PackageError(f"revision {revision} was asked for, but {path} is revision "
                           f"{manifest['revision']} (its {MANIFEST})")
    verify_manifest(path, manifest)
    return OpenedPackage(path, name if is_builtin else manifest["name"], manifest["revision"], formats,
                         config, model_dtype, "verified", support, identity, is_builtin, manifest)

