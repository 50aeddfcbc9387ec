"""The on-disk autotune cache: one SQLite file (the working form) or its canonical JSON export
(the shipped, reviewed form). Both hold one entry per key; the runtime reads either.

SQLite: through sqlite-utils, WAL, a `meta` table with the kind and schema version,
a `tiles` table with one row per key digest. Writers are serialised by a filelock on
`<file>.lock`; each entry is committed as soon as it is tuned, so a killed tuner loses at
most the key in flight. The JSON form is rewritten atomically (temp file + rename) under the
same kind of lock, so a reader never sees half a file.

Every problem with a file (not SQLite, truncated, corrupt, another program's schema, a newer
schema) raises CacheError naming the file and what is wrong; the resolver then applies the
miss policy.
"""
from __future__ import annotations

import datetime as _dt
import functools
import json
import os
import sqlite3
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable

from vsr.autotune.keys import CacheKey

if TYPE_CHECKING:
    from filelock import FileLock

KIND = "vsr-autotune-cache"
SCHEMA_VERSION = 1
SQLITE_MAGIC = b"SQLite format 3\x00"
LOCK_TIMEOUT_S = 120


class CacheError(Exception):
    """An autotune cache file cannot be used; the message names the file and the reason."""


def now_utc() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def tool_versions() -> dict[str, str]:
    import platform

    import torch
    import triton
    return {"python": platform.python_version(), "torch": torch.__version__, "triton": triton.__version__}


@dataclass
class Entry:
    key: CacheKey
    tile: dict
    ms: float | None = None
    candidates: list = field(default_factory=list)   # [{"tile", "ms", "ok", "error"}, ...] best first
    versions: dict = field(default_factory=dict)
    tuned_at: str = ""

    @property
    def digest(self) -> str:
        return self.key.digest()

    def to_json(self) -> dict[str, Any]:
        return {"key": self.key.as_dict(), "digest": self.digest, "tile": self.tile, "ms": self.ms,
                "candidates": self.candidates, "versions": self.versions, "tuned_at": self.tuned_at}

    @classmethod
    def from_json(cls, d: dict[str, Any], *, verify: bool = True) -> "Entry":
        """verify=False leaves the stated digest unchecked (JsonStore checks it when the entry is
        first used: a check per entry costs a shipped cache's loading process ~0.1 s)."""
        key = CacheKey.from_dict(d["key"])
        if verify and "digest" in d and d["digest"] != key.digest():
            raise ValueError(f"entry digest {d['digest']} does not match its key ({key.digest()})")
        if not isinstance(d.get("tile"), dict) or not d["tile"]:
            raise ValueError(f"entry {key.digest()} has no tile")
        return cls(key=key, tile=d["tile"], ms=d.get("ms"), candidates=d.get("candidates") or [],
                   versions=d.get("versions") or {}, tuned_at=d.get("tuned_at") or "")


def _dumps(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))


def canonical_json(entries: Iterable[Entry]) -> str:
    """The export: entries sorted by their canonical key; keys sorted; one trailing newline.
    Byte-stable: the same entries always give the same bytes."""
    ents = sorted(entries, key=lambda e: e.key.canonical())
    doc = {"kind": KIND, "schema_version": SCHEMA_VERSION,
           "devices": sorted({e.key.device for e in ents}),
           "entries": [e.to_json() for e in ents]}
    return json.dumps(doc, sort_keys=True, indent=1, ensure_ascii=True) + "\n"


class Store:
    """Common interface of both forms."""

    path: Path

    def get(self, digest: str) -> Entry | None:
        raise NotImplementedError

    def entries(self) -> list[Entry]:
        raise NotImplementedError

    def put(self, entry: Entry, *, replace: bool = False) -> bool:
        """Record `entry`; False (and nothing written) when its key is present and not `replace`."""
        raise NotImplementedError

    def delete(self, digests: Iterable[str]) -> int:
        """Remove the entries with these key digests (in one write); how many were there."""
        raise NotImplementedError

    def devices(self) -> set[str]:
        return {e.key.device for e in self.entries()}

    def lock(self) -> FileLock:
        from filelock import FileLock   # here, not at import: a loading process never writes
        return FileLock(str(self.path) + ".lock", timeout=LOCK_TIMEOUT_S)

    def close(self) -> None:
        pass


class SqliteStore(Store):
    def __init__(self, path: str | Path, *, create: bool = True):
        import sqlite_utils

        self.path = Path(path)
        if not self.path.exists() or self.path.stat().st_size == 0:
            if not create:
                raise CacheError(f"autotune cache {self.path} does not exist" if not self.path.exists()
                                 else f"autotune cache {self.path} is empty (0 bytes): truncated")
            self._create()
        self._check_header()
        try:
            conn = sqlite3.connect(str(self.path), timeout=30, isolation_level=None)
            conn.execute("PRAGMA busy_timeout=30000")
            self.db = sqlite_utils.Database(conn)
            ok = conn.execute("PRAGMA quick_check").fetchone()[0]
            if ok != "ok":
                raise CacheError(f"autotune cache {self.path} is corrupt (SQLite quick_check: {ok})")
            tables = set(self.db.table_names())
        except sqlite3.DatabaseError as e:
            raise CacheError(f"autotune cache {self.path} cannot be read as SQLite ({e}): "
                             "truncated or corrupt") from None
        if "meta" not in tables or "tiles" not in tables:
            raise CacheError(f"{self.path} is an SQLite file but not a vsr autotune cache "
                             f"(tables: {', '.join(sorted(tables)) or 'none'}): foreign schema")
        meta = {r["key"]: r["value"] for r in self.db["meta"].rows}
        if meta.get("kind") != KIND:
            raise CacheError(f"{self.path} is not a vsr autotune cache (meta kind {meta.get('kind')!r}): foreign schema")
        if meta.get("schema_version") != str(SCHEMA_VERSION):
            raise CacheError(f"autotune cache {self.path} has schema version {meta.get('schema_version')}; "
                             f"this vsr reads version {SCHEMA_VERSION}")

    def _check_header(self) -> None:
        with open(self.path, "rb") as f:
            head = f.read(100)
        if not head.startswith(SQLITE_MAGIC):
            raise CacheError(f"autotune cache {self.path} is not an SQLite file (no SQLite header): corrupt, "
                             "or a JSON cache without the .json suffix")
        if len(head) < 100:
            raise CacheError(f"autotune cache {self.path} is truncated ({len(head)} bytes)")

    def _create(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.lock():
            if self.path.exists() and self.path.stat().st_size > 0:
                return  # another process created it while we waited
            # Built beside the target and renamed into place once complete: a process killed while
            # creating the file leaves no half-made cache (an SQLite header without the tables would
            # read as a foreign schema from then on).
            fd, tmp = tempfile.mkstemp(prefix=self.path.name + ".", suffix=".new", dir=str(self.path.parent))
            os.close(fd)
            try:
                conn = sqlite3.connect(tmp, isolation_level=None)
                try:
                    conn.execute("PRAGMA journal_mode=WAL")
                    conn.execute("BEGIN IMMEDIATE")
                    conn.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT)")
                    conn.execute("""CREATE TABLE tiles (digest TEXT PRIMARY KEY, key TEXT NOT NULL, device TEXT,
                        triton TEXT, template TEXT, source_hash TEXT, params TEXT, N INTEGER, K INTEGER,
                        bucket INTEGER, act_dtype TEXT, tile TEXT NOT NULL, ms REAL, candidates TEXT,
                        versions TEXT, tuned_at TEXT)""")
                    conn.executemany("INSERT INTO meta VALUES (?, ?)",
                                     [("kind", KIND), ("schema_version", str(SCHEMA_VERSION)), ("created", now_utc())])
                    conn.execute("COMMIT")
                finally:
                    conn.close()  # the last connection: the WAL is checkpointed into the file and removed
                _chmod_as_new(tmp)
                os.replace(tmp, self.path)
            finally:
                for leftover in (tmp, tmp + "-wal", tmp + "-shm"):
                    if os.path.exists(leftover):
                        os.unlink(leftover)

    @staticmethod
    def _row_to_entry(r: dict) -> Entry:
        return Entry(key=CacheKey.from_canonical(r["key"]), tile=json.loads(r["tile"]), ms=r["ms"],
                     candidates=json.loads(r["candidates"] or "[]"), versions=json.loads(r["versions"] or "{}"),
                     tuned_at=r["tuned_at"] or "")

    def get(self, digest: str) -> Entry | None:
        try:
            rows = list(self.db.query("SELECT * FROM tiles WHERE digest = ?", [digest]))
        except sqlite3.DatabaseError as e:
            raise CacheError(f"autotune cache {self.path} cannot be read ({e})") from None
        return self._row_to_entry(rows[0]) if rows else None

    def entries(self) -> list[Entry]:
        try:
            rows = list(self.db.query("SELECT * FROM tiles ORDER BY key"))
        except sqlite3.DatabaseError as e:
            raise CacheError(f"autotune cache {self.path} cannot be read ({e})") from None
        return [self._row_to_entry(r) for r in rows]

    def devices(self) -> set[str]:
        return {r["device"] for r in self.db.query("SELECT DISTINCT device FROM tiles")}

    def put(self, entry: Entry, *, replace: bool = False) -> bool:
        k = entry.key
        row = {"digest": k.digest(), "key": k.canonical(), "device": k.device, "triton": k.triton,
               "template": k.template, "source_hash": k.source_hash, "params": k.params, "N": k.N, "K": k.K,
               "bucket": k.bucket, "act_dtype": k.act_dtype, "tile": _dumps(entry.tile), "ms": entry.ms,
               "candidates": _dumps(entry.candidates), "versions": _dumps(entry.versions),
               "tuned_at": entry.tuned_at}
        with self.lock():
            # One transaction per entry (the check and the write together), committed as soon as it
            # is tuned. The row is written in plain SQL: sqlite-utils 3.x's insert() commits the
            # connection on its own, which would end this transaction before its COMMIT.
            with self._write_transaction("record an entry") as conn:
                if not replace and self.get(row["digest"]) is not None:
                    return False
                cols = ", ".join(f'"{c}"' for c in row)
                conn.execute(f"INSERT OR REPLACE INTO tiles ({cols}) VALUES ({', '.join('?' * len(row))})",
                             list(row.values()))
        return True

    def delete(self, digests: Iterable[str]) -> int:
        ds = sorted(set(digests))
        if not ds:
            return 0
        with self.lock():
            # One statement per digest, not one `IN (?, ...)` list: older SQLite allows at most 999
            # bound variables in a statement. Still one transaction: all of them go, or none.
            with self._write_transaction("delete entries") as conn:
                cur = conn.executemany("DELETE FROM tiles WHERE digest = ?", [(d,) for d in ds])
        return cur.rowcount

    @contextmanager
    def _write_transaction(self, what: str):
        """One write transaction on the connection: BEGIN IMMEDIATE ... COMMIT (ROLLBACK on an error).
        IMMEDIATE takes the write lock up front, waiting out the busy timeout: a deferred BEGIN that
        reads and then writes fails at once with "database is locked" when another connection
        committed in between (the busy timeout does not cover that upgrade). Not sqlite-utils'
        atomic(): it exists from sqlite-utils 4.0 only. SQLite's errors become CacheError."""
        conn = self.db.conn
        try:
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    try:
                        conn.execute("ROLLBACK")
                    except sqlite3.Error:
                        pass  # the error being raised says more than a failed rollback
                raise
        except sqlite3.Error as e:   # locked, read-only, malformed, constraint: the file's problem
            raise CacheError(f"autotune cache {self.path}: cannot {what} ({e})") from None

    def integrity_check(self) -> str:
        return self.db.conn.execute("PRAGMA integrity_check").fetchone()[0]

    def close(self) -> None:
        self.db.conn.close()


class JsonStore(Store):
    """The canonical export as a store: read whole; each put rewrites the file atomically."""

    def __init__(self, path: str | Path, *, create: bool = True):
        self.path = Path(path)
        self._entries: dict[str, Entry] = {}
        self._sorted: list[Entry] | None = None
        self._read_stamp = None
        self._unverified: dict[str, int] = {}   # stated digest -> entry index, until first used
        if self.path.exists():
            self._entries = self._read()
        elif not create:
            raise CacheError(f"autotune cache {self.path} does not exist")

    def _read(self) -> dict[str, Entry]:
        self._read_stamp = self._stamp()
        try:
            text = self.path.read_text()
        except (OSError, UnicodeDecodeError) as e:
            raise CacheError(f"autotune cache {self.path} cannot be read ({e})") from None
        if not text.strip():
            raise CacheError(f"autotune cache {self.path} is empty: truncated")
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as e:
            raise CacheError(f"autotune cache {self.path} is not valid JSON ({e}): truncated or corrupt") from None
        if not isinstance(doc, dict) or doc.get("kind") != KIND:
            raise CacheError(f"{self.path} is not a vsr autotune cache (no \"kind\": \"{KIND}\"): foreign schema")
        if doc.get("schema_version") != SCHEMA_VERSION:
            raise CacheError(f"autotune cache {self.path} has schema version {doc.get('schema_version')}; "
                             f"this vsr reads version {SCHEMA_VERSION}")
        out: dict[str, Entry] = {}
        self._unverified = {}
        for i, d in enumerate(doc.get("entries") or []):
            try:
                e = Entry.from_json(d, verify=False)
                stated = d.get("digest")
                if stated is not None and not isinstance(stated, str):
                    raise ValueError(f"digest {stated!r} is not a string")
            except (KeyError, TypeError, ValueError) as err:
                raise CacheError(f"autotune cache {self.path}: entry {i} is malformed ({err})") from None
            if stated is None:
                out[e.digest] = e
            else:
                out[stated] = e
                self._unverified[stated] = i
        return out

    def _verified(self, digest: str, e: Entry | None) -> Entry | None:
        """The entry under its stated digest once that digest is checked against its key."""
        if e is not None and digest in self._unverified:
            i = self._unverified.pop(digest)
            if e.digest != digest:
                raise CacheError(f"autotune cache {self.path}: entry {i} is malformed (entry digest {digest} "
                                 f"does not match its key ({e.digest}))")
        return e

    def get(self, digest: str) -> Entry | None:
        return self._verified(digest, self._entries.get(digest))

    def entries(self) -> list[Entry]:
        if self._sorted is None:
            for d, e in list(self._entries.items()):
                self._verified(d, e)
            self._sorted = sorted(self._entries.values(), key=lambda e: e.key.canonical())
        return list(self._sorted)

    def devices(self) -> set[str]:
        return {e.key.device for e in self._entries.values()}

    def _stamp(self):
        try:
            st = self.path.stat()
        except FileNotFoundError:
            return None
        return (st.st_mtime_ns, st.st_size, st.st_ino)

    def refresh(self) -> None:
        """Re-read the file if it changed since it was read (a miss must not re-parse an unchanged file)."""
        stamp = self._stamp()
        if stamp is not None and stamp != self._read_stamp:
            self._entries = self._read()
            self._sorted = None

    def put(self, entry: Entry, *, replace: bool = False) -> bool:
        with self.lock():
            self.refresh()  # another process may have written since we read
            self.entries()  # every stated digest checked before the file is rewritten
            if not replace and entry.digest in self._entries:
                return False
            self._entries[entry.digest] = entry
            self._sorted = None
            write_atomic(self.path, canonical_json(self._entries.values()))
        return True

    def delete(self, digests: Iterable[str]) -> int:
        with self.lock():
            self.refresh()
            self.entries()
            gone = [d for d in set(digests) if self._entries.pop(d, None) is not None]
            if gone:
                self._sorted = None
                write_atomic(self.path, canonical_json(self._entries.values()))
        return len(gone)


@functools.lru_cache(maxsize=None)
def _umask() -> int:
    # Read once: os.umask can only be read by setting it, which is not thread-safe.
    mask = os.umask(0o077)
    os.umask(mask)
    return mask


def _chmod_as_new(tmp: str) -> None:
    """Give a file made by mkstemp (always 0600) the mode that open() would give a new file, so
    a cache or export renamed into place is as readable as any other file its user writes."""
    os.chmod(tmp, 0o666 & ~_umask())


def write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=str(path.parent))
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        _chmod_as_new(tmp)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def is_json_path(path: str | Path) -> bool:
    return str(path).endswith(".json")


def open_store(path: str | Path, *, create: bool = True) -> Store:
    """A .json path is the canonical export; anything else is the SQLite form."""
    return JsonStore(path, create=create) if is_json_path(path) else SqliteStore(path, create=create)


def export_json(store: Store, out: str | Path) -> int:
    """Write `store` in canonical JSON to `out` (atomically); the number of entries."""
    ents = store.entries()
    write_atomic(Path(out), canonical_json(ents))
    return len(ents)


def merge(dst: Store, src: Store, *, prefer_incoming: bool = False) -> dict[str, Any]:
    """Merge `src` into `dst` in canonical key order. Same key and tile: nothing to do. Same key,
    different tile: a conflict, reported; the existing tile is kept unless prefer_incoming."""
    report: dict[str, Any] = {"added": 0, "identical": 0, "conflicts": [], "replaced": 0}
    for e in sorted(src.entries(), key=lambda e: e.key.canonical()):
        cur = dst.get(e.digest)
        if cur is None:
            dst.put(e)
            report["added"] += 1
        elif _dumps(cur.tile) == _dumps(e.tile):
            report["identical"] += 1
        else:
            report["conflicts"].append({"key": e.key.as_dict(), "digest": e.digest, "existing": cur.tile,
                                        "incoming": e.tile, "kept": "incoming" if prefer_incoming else "existing"})
            if prefer_incoming:
                dst.put(e, replace=True)
                report["replaced"] += 1
    return report


def entries_by_lineage(paths: Iterable[str | Path]) -> dict[CacheKey, list[Entry]]:
    """The entries of the cache files `paths` (.json or .db, read only) by key lineage
    (CacheKey.lineage: whatever kernel source and Triton they were tuned for), the first file's
    first."""
    out: dict[CacheKey, list[Entry]] = {}
    for p in paths:
        st = open_store(p, create=False)
        try:
            for e in st.entries():
                out.setdefault(e.key.lineage(), []).append(e)
        finally:
            st.close()
    return out


def incumbent_tiles(paths: Iterable[str | Path]) -> dict[CacheKey, list[dict]]:
    """The tiles each key has in the cache files `paths`, by key lineage (entries_by_lineage), the
    first file's tile first: what vsr-tune --incumbents adds to a key's candidates
    (tuner.with_incumbents drops repeats and tiles the search space no longer holds)."""
    return {lineage: [dict(e.tile) for e in entries] for lineage, entries in entries_by_lineage(paths).items()}
