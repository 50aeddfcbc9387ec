"""Compiled-kernel bundles: Triton's own cache entries, shipped beside the tiles.

A bundle is a gzip'd tar of Triton cache-dir entries, `entries/<triton key>/<file>` (each compiled
kernel's metadata `.json` and binary `.cubin`/`.hsaco` with its `__grp__` index, and the C
launcher modules Triton builds per signature, `cuda_utils` and `__triton_launcher`), plus
`manifest.json`: the device identity (autotune.device_id, as the cache keys have it), the Triton
and Python versions, the kernels' source hashes (autotune.keys.kernel_source_hash, per
template), the autotune cache keys it was compiled for, and the sha256 of every entry file.

Triton's own key (its installation's hash, the kernel's source and specialization, the target,
the options) names each entry's directory, so an entry is found only by the very compile that
wrote it. `activate` checks a bundle (manifest readable, same device identity and Triton
version, every file's checksum; otherwise it is refused with the reason and never loaded),
unpacks it once into $VSR_CACHE_DIR/bundles/<sha256 of the file>/, and sets Triton's cache
manager (`triton.knobs.cache.manager_class`) to BundleCacheManager: lookups read the bundle's
entries first, then Triton's own cache dir (TRITON_CACHE_DIR), where whatever is compiled is
written as usual. A lookup the bundle misses warns once per process, and every compile is counted
(`stats()`).
"""
from __future__ import annotations

import datetime as _dt
import hashlib
import io
import json
import os
import platform
import shutil
import sys
import tarfile
import tempfile
import warnings
from pathlib import Path
from typing import Iterable

from vsr.autotune.device_id import DeviceIdentity

KIND = "vsr compiled-kernel bundle"
FORMAT = 1
SUFFIX = ".bundle.tar.gz"
MANIFEST = "manifest.json"
BUNDLE_ENV = "VSR_KERNEL_BUNDLE"      # an explicit bundle file (overrides the search); "off": none
# Kept per compiled kernel: its metadata and the binary the driver loads; the IR text of each
# stage (ttir, ttgir, llir, ptx, amdgcn) is not needed to launch it.
_KEPT_SUFFIXES = (".json", ".cubin", ".hsaco")


class BundleError(Exception):
    """A bundle that is not used: corrupt, or for another device or Triton version."""


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def python_tag() -> str:
    return f"{sys.implementation.name}{sys.version_info.major}.{sys.version_info.minor}-{platform.machine()}"


def default_name(stem: str, triton_version: str) -> str:
    """`<cache stem>.triton-<version>.bundle.tar.gz`, e.g. nvidia-h200.triton-3.6.0.bundle.tar.gz."""
    return f"{stem}.triton-{triton_version}{SUFFIX}"


# --- writing -----------------------------------------------------------------------------------

def _entry_files(cache_dir: Path) -> dict[str, Path]:
    """The files of a Triton cache dir worth shipping, as 'key/name' -> path. A kernel group keeps
    its metadata and binary only, and its `__grp__` index is rewritten to name just those."""
    out: dict[str, Path] = {}
    for kdir in sorted(p for p in cache_dir.iterdir() if p.is_dir()):
        for f in sorted(kdir.iterdir()):
            if not f.is_file() or f.name.startswith("tmp.") or f.name == "lock":
                continue
            if f.name.startswith("__grp__") or f.suffix in _KEPT_SUFFIXES or f.name.endswith((".so", ".pyd")):
                out[f"{kdir.name}/{f.name}"] = f
    return out


def _group_bytes(path: Path) -> bytes:
    """A `__grp__` index naming only the kept children, by file name (the reader resolves them
    inside the bundle; Triton's own index holds absolute paths of the machine that compiled)."""
    data = json.loads(path.read_text())
    kids = {c: os.path.basename(p) for c, p in data.get("child_paths", {}).items()
            if c.endswith(_KEPT_SUFFIXES)}
    return json.dumps({"child_paths": kids}, sort_keys=True).encode()


def write_bundle(cache_dir: str | Path, out: str | Path, *, identity: DeviceIdentity | str, triton_version: str,
                 source_hashes: dict[str, str], keys: Iterable[str] = (), extra: dict | None = None) -> dict:
    """Pack the Triton cache dir `cache_dir` (written by the compiles this bundle is for) into `out`;
    returns the manifest."""
    cache_dir, out = Path(cache_dir), Path(out)
    files = _entry_files(cache_dir)
    blobs: dict[str, bytes] = {}
    for name, path in files.items():
        blobs[name] = _group_bytes(path) if path.name.startswith("__grp__") else path.read_bytes()
    ident = identity if isinstance(identity, str) else identity.key()
    manifest = {
        "kind": KIND, "format": FORMAT, "device": ident, "device_name": DeviceIdentity.from_key(ident).name,
        "triton": triton_version, "python": python_tag(), "source_hashes": dict(sorted(source_hashes.items())),
        "cache_keys": sorted(set(keys)), "created": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "kernels": sum(1 for n in blobs if n.split("/", 1)[1].startswith("__grp__")),
        "files": {n: hashlib.sha256(b).hexdigest() for n, b in sorted(blobs.items())},
        **(extra or {}),
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    with tarfile.open(tmp, "w:gz", compresslevel=6) as tar:
        def add(name: str, data: bytes) -> None:
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o644, 0   # byte-stable: no times, no owners
            tar.addfile(info, io.BytesIO(data))
        add(MANIFEST, json.dumps(manifest, indent=1, sort_keys=True).encode())
        for name in sorted(blobs):
            add(f"entries/{name}", blobs[name])
    os.replace(tmp, out)
    return manifest


# --- reading and checking ------------------------------------------------------------------------

def read_manifest(path: str | Path) -> dict:
    """The manifest of a bundle file; BundleError if it is not a readable bundle."""
    try:
        with tarfile.open(path, "r:gz") as tar:
            member = tar.next()
            if member is None or member.name != MANIFEST:
                raise BundleError(f"{path}: not a vsr kernel bundle (no {MANIFEST} first)")
            m = json.loads(tar.extractfile(member).read())
    except (OSError, tarfile.TarError, EOFError, json.JSONDecodeError, UnicodeDecodeError) as e:
        raise BundleError(f"{path}: corrupt kernel bundle ({e})") from None
    if not isinstance(m, dict) or m.get("kind") != KIND:
        raise BundleError(f"{path}: not a vsr kernel bundle (manifest kind {m.get('kind') if isinstance(m, dict) else m!r})")
    if m.get("format") != FORMAT:
        raise BundleError(f"{path}: kernel bundle format {m.get('format')!r}, this vsr reads format {FORMAT}")
    if not isinstance(m.get("files"), dict):
        raise BundleError(f"{path}: corrupt kernel bundle (manifest lists no files)")
    return m


def check_compatible(manifest: dict, path, identity: DeviceIdentity | str, triton_version: str) -> None:
    """BundleError unless the bundle was compiled on this device identity with this Triton."""
    mine = identity if isinstance(identity, str) else identity.key()
    if manifest.get("device") != mine:
        theirs = manifest.get("device_name", "?")
        try:
            t = DeviceIdentity.from_key(manifest["device"])
            theirs = f"{t.name} ({t.arch}, {t.multiprocessors} MP)"
        except Exception:   # a manifest of another vsr's identity format: its name is enough
            pass
        me = DeviceIdentity.from_key(mine)
        raise BundleError(f"{path}: kernel bundle compiled for {theirs}, this device is {me.name} ({me.arch}, "
                          f"{me.multiprocessors} MP): other device")
    if manifest.get("triton") != triton_version:
        raise BundleError(f"{path}: kernel bundle compiled with Triton {manifest.get('triton')}, this is "
                          f"Triton {triton_version}: other Triton version")


def unpack(path: str | Path, root: Path) -> tuple[Path, dict]:
    """Verify every file of bundle `path` against its manifest and unpack it (once) under `root`
    (the runtime's: $VSR_CACHE_DIR/bundles); returns (the unpacked entries dir, the manifest)."""
    path = Path(path)
    manifest = read_manifest(path)
    digest = _sha256_file(path)
    root = Path(root)
    final = root / digest[:32]
    if (final / MANIFEST).is_file():
        return final / "entries", manifest
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=root))
    try:
        want = manifest["files"]
        seen: set[str] = set()
        try:
            with tarfile.open(path, "r:gz") as tar:
                for m in tar:
                    if m.name == MANIFEST:
                        continue
                    name = m.name.removeprefix("entries/")
                    parts = name.split("/")
                    if (not m.isfile() or not m.name.startswith("entries/") or len(parts) != 2
                            or any(p in ("", ".", "..") for p in parts)):
                        raise BundleError(f"{path}: corrupt kernel bundle (unexpected member {m.name!r})")
                    data = tar.extractfile(m).read()
                    if want.get(name) != hashlib.sha256(data).hexdigest():
                        raise BundleError(f"{path}: corrupt kernel bundle ({name} does not match its checksum"
                                          + ("" if name in want else ": not in the manifest") + ")")
                    dest = tmp / "entries" / parts[0]
                    dest.mkdir(parents=True, exist_ok=True)
                    (dest / parts[1]).write_bytes(data)
                    seen.add(name)
        except (OSError, tarfile.TarError, EOFError) as e:
            raise BundleError(f"{path}: corrupt kernel bundle ({e})") from None
        missing = sorted(set(want) - seen)
        if missing:
            raise BundleError(f"{path}: corrupt kernel bundle ({len(missing)} listed files missing, e.g. {missing[0]})")
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True))
        try:
            os.rename(tmp, final)
        except OSError:   # another process unpacked it meanwhile
            if not (final / MANIFEST).is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final / "entries", manifest


# --- Triton's cache manager over a bundle ----------------------------------------------------------

_STATS = {"bundle_hits": 0, "bundle_misses": 0, "compiles": 0, "builds": 0}
_STATE: dict = {"root": None, "path": None, "warned": False}


def stats() -> dict:
    """Counts since activation: lookups served by the bundle, lookups it missed, kernels Triton
    compiled (a kernel group written) and C modules it built (a launcher or utility .so written)."""
    return dict(_STATS)


def _manager_base():
    from triton.runtime.cache import FileCacheManager
    return FileCacheManager


def _make_manager_class():
    base = _manager_base()

    class BundleCacheManager(base):
        """Triton's FileCacheManager (TRITON_CACHE_DIR: where new compiles are written) with the
        active bundle's entries looked up first."""

        def _bundle_dir(self) -> Path | None:
            root = _STATE["root"]
            return None if root is None else root / self.key

        def get_file(self, filename):
            d = self._bundle_dir()
            if d is not None and (d / filename).is_file():
                _STATS["bundle_hits"] += 1
                return str(d / filename)
            if d is not None:
                _miss(filename)
            return super().get_file(filename)

        def get_group(self, filename):
            d = self._bundle_dir()
            if d is not None and (d / f"__grp__{filename}").is_file():
                try:
                    kids = json.loads((d / f"__grp__{filename}").read_text())["child_paths"]
                    group = {c: str(d / n) for c, n in kids.items()}
                    if all(os.path.isfile(p) for p in group.values()) and filename in group:
                        _STATS["bundle_hits"] += 1
                        return group
                except (OSError, ValueError, KeyError, TypeError):
                    pass
            if d is not None:
                _miss(filename)
            return super().get_group(filename)

        def put_group(self, filename, group):
            _STATS["compiles"] += 1
            return super().put_group(filename, group)

        def put(self, data, filename, binary=True):
            if filename.endswith((".so", ".pyd")):
                _STATS["builds"] += 1
            return super().put(data, filename, binary)

    return BundleCacheManager


def _miss(filename: str) -> None:
    _STATS["bundle_misses"] += 1
    if not _STATE["warned"]:
        _STATE["warned"] = True
        what = filename.removesuffix(".json")
        warnings.warn(f"compiled-kernel bundle {_STATE['path']} has no entry for {what} (this call's kernel, "
                      f"specialization or launcher): Triton compiles it now (JIT); further misses of this "
                      f"process are not reported (vsr-tune compile adds them)", stacklevel=2)


def activate(path: str | Path, identity: DeviceIdentity | str, root: Path, triton_version: str | None = None) -> dict:
    """Use bundle `path` for this process's Triton compiles; returns its manifest. Raises
    BundleError (nothing activated) for a corrupt bundle or one of another device or Triton."""
    from triton import knobs

    if triton_version is None:
        import triton
        triton_version = triton.__version__
    manifest = read_manifest(path)
    check_compatible(manifest, path, identity, triton_version)
    current = knobs.cache.manager_class
    if current is not None and getattr(current, "__name__", "") != "BundleCacheManager":
        raise BundleError(f"{path}: not used: Triton's cache manager is set to {current.__name__} "
                          "(TRITON_CACHE_MANAGER), which a bundle would replace")
    entries, manifest = unpack(path, root)
    _STATE.update(root=entries, path=str(path), warned=False)
    for k in _STATS:
        _STATS[k] = 0
    knobs.cache.manager_class = _make_manager_class()
    return manifest


def active_path() -> str | None:
    """The bundle this process's Triton compiles read, or None."""
    return _STATE["path"]


def deactivate() -> None:
    from triton import knobs
    _STATE.update(root=None, path=None, warned=False)
    knobs.cache.manager_class = None


# --- where bundles are found -----------------------------------------------------------------------

def installed_dir(root: Path) -> Path:
    """Where `vsr-tune import` puts bundles: <root>/installed (root: $VSR_CACHE_DIR/bundles)."""
    return Path(root) / "installed"


def search_dirs(cache_path: Path | None, root: Path) -> list[Path]:
    """Beside the autotune cache in use (caches/ of a checkout or wheel), then installed_dir(root)."""
    out = []
    if cache_path is not None:
        out.append(Path(cache_path).resolve().parent)
    out.append(installed_dir(root))
    return [d for d in out if d.is_dir()]


def find_and_activate(identity: DeviceIdentity, cache_path: Path | None, root: Path,
                      triton_version: str | None = None) -> dict | None:
    """Activate the bundle for this device and Triton: $VSR_KERNEL_BUNDLE if set, else the first
    compatible `*.bundle.tar.gz` of search_dirs. A refused bundle warns with its reason (the
    process compiles by JIT), except one merely of another device beside the cache (bundles of
    several devices may ship together); no bundle at all is silent. Returns the manifest used, or
    None."""
    if triton_version is None:
        import triton
        triton_version = triton.__version__
    explicit = os.environ.get(BUNDLE_ENV)
    if explicit == "off":
        return None
    candidates = [Path(explicit)] if explicit else [
        p for d in search_dirs(cache_path, root) for p in sorted(d.glob(f"*{SUFFIX}"))]
    refused = []
    for p in candidates:
        try:
            if not explicit:   # several may lie there (other devices, Triton versions): pick by manifest
                check_compatible(read_manifest(p), p, identity, triton_version)
            return activate(p, identity, root, triton_version)
        except BundleError as e:
            refused.append(str(e))
    noisy = [r for r in refused if explicit or not r.endswith("other device")]
    if noisy:
        warnings.warn("kernel bundle refused, kernels compile by JIT: " + "; ".join(noisy), stacklevel=2)
    return None
