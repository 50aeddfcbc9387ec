"""Which tile a call runs: the cache's recorded tile, or the miss policy (contract 6).

TileResolver(cache, policy, device).tile(template, problem):
  hit  -> the recorded tile; no timing at all (`timing_calls` stays 0);
  miss -> "tune": sweep and record (one process per key: a per-key file lock, and a re-read
                  under it, so concurrent processes never tune the same key twice);
          "default": the template's deterministic default tile, with a warning once per key;
          "error": CacheMiss naming the key.
TileResolver(None) reads the shipped cache of this exact device, if any (use_shipped=False: none).
A cache file that cannot be used (truncated, corrupt, foreign schema, tuned on another device)
is reported with the reason; under "error" that is fatal, otherwise the policy applies to
every lookup (and "tune" keeps what it tunes in memory: a broken file is never overwritten).

shipped_cache_for(identity) picks the caches/ file whose recorded device identity equals the
detected one exactly.
"""
from __future__ import annotations

import os
import threading
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from vsr.autotune.device_id import DeviceIdentity, current_device_identity
from vsr.autotune.keys import CacheKey, make_key
from vsr.autotune.store import CacheError, Entry, JsonStore, Store, now_utc, open_store, tool_versions

if TYPE_CHECKING:
    from filelock import FileLock

POLICIES = ("tune", "default", "error")
CACHES_ENV = "VSR_AUTOTUNE_CACHES"


class CacheMiss(CacheError):
    """Policy "error" and no tile recorded for a key."""


class TileResolver:
    def __init__(self, cache: str | Path | None = None, policy: str = "default", device=None, *,
                 identity: DeviceIdentity | None = None, timer=None, graph: bool = True, jobs: int | None = None,
                 on_tuned=None, use_shipped: bool = True):
        if policy not in POLICIES:
            raise ValueError(f"miss policy must be one of {', '.join(POLICIES)}, got {policy!r}")
        self.policy = policy
        if device is None:
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.device = torch.device(device)
        self.identity = identity or current_device_identity(self.device)
        self.cache_path = Path(cache) if cache is not None else None
        # No cache named: the shipped file for this exact device, read-only (tiles tuned under
        # policy "tune" then stay in memory; the shipped file is never written by the runtime).
        self.read_only = False
        if self.cache_path is None and use_shipped:
            shipped = shipped_cache_for(self.identity)
            if shipped is not None:
                self.cache_path, self.read_only = shipped, True
        self.timer, self.graph, self.jobs, self.on_tuned = timer, graph, jobs, on_tuned
        self.timing_calls = 0
        self.tuned: list[CacheKey] = []
        self.problem: str | None = None   # why the cache file is not used, when it is not
        self.store: Store | None = None
        self._memo: dict[str, dict] = {}
        self._loaded: dict[str, dict] = {}
        self._warned: set[str] = set()
        self._lock = threading.Lock()
        if self.cache_path is not None:
            self._open()

    def _open(self) -> None:
        try:
            self.store = open_store(self.cache_path, create=(self.policy == "tune" and not self.read_only))
            mine = self.identity.key()
            entries = self.store.entries()
            self._loaded = {e.digest: e.tile for e in entries if e.key.device == mine}
            devices = {e.key.device for e in entries}
            if devices and mine not in devices:
                names = sorted({DeviceIdentity.from_key(d).name + f" ({DeviceIdentity.from_key(d).arch}, "
                                f"{DeviceIdentity.from_key(d).multiprocessors} MP)" for d in devices})
                raise CacheError(f"autotune cache {self.cache_path} holds tiles for {', '.join(names)}, none for "
                                 f"this device ({self.identity.name}, {self.identity.arch}, "
                                 f"{self.identity.multiprocessors} MP): other device")
        except CacheError as e:
            other_device = str(e).endswith("other device")
            if self.policy == "error":
                raise
            if not other_device:
                self.store, self._loaded = None, {}
            self.problem = str(e)
            warnings.warn(f"{e}; miss policy '{self.policy}' applies to every lookup"
                          + ("" if self.policy != "tune" or other_device
                             else " (tiles tuned now are kept in memory only)"), stacklevel=3)

    def key(self, template, problem) -> CacheKey:
        return make_key(template, problem, self.identity)

    def tile(self, template, problem, *, weight=None, x=None) -> dict:
        """The tile for `problem`; `weight`/`x` (optional) are used when the policy tunes."""
        key = self.key(template, problem)
        d = key.digest()
        with self._lock:
            if d in self._memo:
                return dict(self._memo[d])
            tile = self._loaded.get(d)
            if tile is None:
                tile = self._miss(template, problem, key, weight, x)
            self._memo[d] = tile
            return dict(tile)

    def _lookup_store(self, d: str) -> dict | None:
        if self.store is None:
            return None
        if isinstance(self.store, JsonStore):
            self.store.refresh()
        e = self.store.get(d)
        return None if e is None else e.tile

    def _miss(self, template, problem, key: CacheKey, weight, x) -> dict:
        # Another process may have recorded it since we loaded.
        found = self._lookup_store(key.digest())
        if found is not None:
            return found
        where = f" in {self.cache_path}" if self.cache_path else " (no autotune cache given)"
        why = f" ({self.problem})" if self.problem else ""
        if self.policy == "error":
            raise CacheMiss(f"no tile recorded{where}{why} for {key.short()}; key {key.canonical()}")
        if self.policy == "default":
            if key.digest() not in self._warned:
                self._warned.add(key.digest())
                warnings.warn(f"autotune cache miss{where}{why} for {key.short()}: using the default tile "
                              f"(run vsr-tune to record one)", stacklevel=4)
            return template.default_tile(problem)
        return self._tune(template, problem, key, weight, x)

    def _key_lock(self, key: CacheKey) -> FileLock | None:
        if self.store is None or self.read_only:
            return None
        lockdir = Path(str(self.cache_path) + ".locks")
        lockdir.mkdir(parents=True, exist_ok=True)
        from filelock import FileLock   # here, not at import: it costs a loading process ~70 ms
        return FileLock(str(lockdir / f"{key.digest()}.lock"))

    def _tune(self, template, problem, key: CacheKey, weight, x, deadline=None, progress=None, tiles=None) -> dict:
        from vsr.autotune import synth, tuner   # (here: a process whose tiles all hit never imports the tuner)
        lock = self._key_lock(key)
        if lock is not None:
            lock.acquire()
        try:
            found = self._lookup_store(key.digest())  # tuned by another process while we waited
            if found is not None:
                return found
            if weight is None:
                weight, _ = synth.for_problem(template, problem, self.device)
            if x is None:  # the most rows the bucket serves
                x = synth.random_activations(problem.bucket, problem.K, problem.act_dtype, self.device)
            before = tuner.timing_calls()
            results = tuner.sweep(template, weight, x, tiles=tiles, problem=problem, timer=self.timer, graph=self.graph,
                                  jobs=self.jobs, deadline=deadline, progress=progress)
            self.timing_calls += tuner.timing_calls() - before
            try:
                tile = tuner.best_tile(results)
            except ValueError as e:
                raise CacheError(f"tuning {key.short()} failed: {e}") from None
            entry = Entry(key=key, tile=tile, ms=results[0]["ms"],
                          candidates=[{k: r[k] for k in ("tile", "ms", "ok", "error", "graph")} for r in results],
                          versions=tool_versions(), tuned_at=now_utc())
            if self.store is not None and not self.read_only and not self.store.put(entry):
                # Recorded by another process after all (e.g. one that reached the file by another
                # path, so another per-key lock): the file's tile wins, so every process agrees.
                found = self._lookup_store(key.digest())
                if found is not None:
                    return found
                # Present when we wrote, gone when we read (e.g. pruned meanwhile): our tile is in
                # no file, so it must not be served or reported as recorded.
                raise CacheError(f"recording {key.short()} in {self.cache_path} failed: the store held "
                                 "the key when we wrote it, and no longer holds it")
            self.tuned.append(key)
            if self.on_tuned is not None:
                self.on_tuned(entry)
            return tile
        finally:
            if lock is not None:
                lock.release()

    def tune(self, template, problem, *, weight=None, x=None, deadline=None, progress=None,
             max_candidates: int | None = None, incumbents: list | None = None,
             paths: tuple[str, ...] | None = None) -> tuple[dict, bool]:
        """Make sure `problem` has a recorded tile (for vsr-tune): (tile, tuned_now). The sweep
        tries the template's whole search space, or `max_candidates` of it (tuner.candidates: the
        default tile and a pick over the rest, shared among the template's pick groups,
        Template.pick_group, where n allows) plus the `incumbents` the space still holds
        (tuner.with_incumbents). `paths`: only the space's tiles of those kernel paths (a tile's
        "path"), then the pick and the incumbents as above; a ValueError if it holds none."""
        key = self.key(template, problem)
        d = key.digest()
        with self._lock:
            tile = self._loaded.get(d) or self._lookup_store(d)
            if tile is not None:
                self._memo[d] = tile
                return dict(tile), False
            n = len(self.tuned)
            tiles = None
            if max_candidates is not None or paths:
                from vsr.autotune import tuner
                space = template.search_space(problem)
                of_paths = [t for t in space if t.get("path") in paths] if paths else space
                if not of_paths:
                    raise ValueError(f"the search space of {key.short()} holds no tile of the paths {', '.join(paths)}")
                pick = of_paths if max_candidates is None else tuner.candidates(of_paths, max_candidates,
                                                                                template.pick_group)
                tiles = tuner.with_incumbents(pick, space, incumbents or [])
            tile = self._tune(template, problem, key, weight, x, deadline, progress, tiles)
            self._memo[d] = tile
            return dict(tile), len(self.tuned) > n


# --- the shipped caches ------------------------------------------------------------------

def cache_dirs() -> list[Path]:
    """Where shipped caches are looked for: $VSR_AUTOTUNE_CACHES, then caches/ beside the
    source tree (editable installs and checkouts), then vsr/autotune/caches (wheels)."""
    out = []
    if os.environ.get(CACHES_ENV):
        out.append(Path(os.environ[CACHES_ENV]))
    here = Path(__file__).resolve().parent
    out += [here.parent / "caches", here / "caches"]
    return [p for p in out if p.is_dir()]


def shipped_cache_for(identity: DeviceIdentity, dirs: list[Path] | None = None) -> Path | None:
    """The shipped .json cache whose recorded devices include `identity` exactly (every field:
    vendor, name, capability/gfx arch, multiprocessors); None when no file matches."""
    want = identity.key()
    for d in (dirs if dirs is not None else cache_dirs()):
        for p in sorted(d.glob("*.json")):
            try:
                devices = JsonStore(p, create=False).devices()
            except CacheError as e:
                warnings.warn(f"skipping shipped cache: {e}", stacklevel=2)
                continue
            if want in devices:
                return p
    return None
