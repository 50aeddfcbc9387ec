"""The store and the resolver: hits time nothing, exports are byte-stable, merges report conflicts,
and broken or foreign cache files are detected with a clear message before the miss policy applies."""
import json
import sqlite3
import warnings

import pytest
import torch

from vsr.autotune import store as store_mod
from vsr.autotune import tuner
from vsr.autotune.device_id import DeviceIdentity
from vsr.autotune.fake import FAKE_DENSE
from vsr.autotune.resolver import CacheMiss, TileResolver, shipped_cache_for
from vsr.autotune.store import CacheError, Entry, JsonStore, SqliteStore, export_json, merge, open_store

H200 = DeviceIdentity("nvidia", "NVIDIA H200", (9, 0), None, 132)
H100 = DeviceIdentity("nvidia", "NVIDIA H100 80GB HBM3", (9, 0), None, 132)
CPU = DeviceIdentity("cpu", "x86_64", None, None, 2)


def fake_timer(fn):
    fn()
    return 1.0 / fn.__defaults__[0]["BLOCK_K"] + 0.001 * fn.__defaults__[0]["BLOCK_N"]


def no_timer(fn):
    raise AssertionError("a cache hit must not time anything")


def problems(Ns=(40, 72), K=64, buckets=(1, 4, 16), dtype=torch.float32):
    from vsr.kernels.dense import DenseWeight
    out = []
    for N in Ns:
        w = DenseWeight(torch.randn(N, K))
        out += [FAKE_DENSE.problem(w, b, dtype) for b in buckets]
    return out


def tuned_db(path, identity=CPU, ps=None):
    r = TileResolver(path, "tune", "cpu", identity=identity, timer=fake_timer)
    tiles = [r.tile(FAKE_DENSE, p) for p in (ps or problems())]
    r.store.close()
    return tiles


def test_hit_does_no_timing_and_returns_the_recorded_tiles(tmp_path):
    db = tmp_path / "c.db"
    tiles = tuned_db(db)
    assert all(t["BLOCK_K"] == 64 for t in tiles)  # the fastest under the fake timer
    before = tuner.timing_calls()
    r = TileResolver(db, "error", "cpu", identity=CPU, timer=no_timer)
    assert [r.tile(FAKE_DENSE, p) for p in problems()] == tiles
    assert r.timing_calls == 0 and tuner.timing_calls() == before
    # the exported JSON serves the same tiles, untimed
    export_json(open_store(db), tmp_path / "c.json")
    r2 = TileResolver(tmp_path / "c.json", "error", "cpu", identity=CPU, timer=no_timer)
    assert [r2.tile(FAKE_DENSE, p) for p in problems()] == tiles and r2.timing_calls == 0


def test_export_import_round_trip_is_byte_stable(tmp_path):
    db = tmp_path / "a.db"
    tuned_db(db)
    export_json(open_store(db), tmp_path / "a.json")
    # import into a fresh db, export again: the same bytes
    fresh = SqliteStore(tmp_path / "b.db")
    rep = merge(fresh, JsonStore(tmp_path / "a.json", create=False))
    assert rep["added"] == len(problems()) and not rep["conflicts"]
    export_json(fresh, tmp_path / "b.json")
    a, b = (tmp_path / "a.json").read_bytes(), (tmp_path / "b.json").read_bytes()
    assert a == b
    doc = json.loads(a)
    assert doc["devices"] == [CPU.key()]
    keys = [json.dumps(e["key"], sort_keys=True) for e in doc["entries"]]
    assert keys == sorted(keys)


def test_merge_reports_conflicts_and_keeps_existing_unless_told(tmp_path):
    tuned_db(tmp_path / "a.db")
    a = SqliteStore(tmp_path / "a.db")
    b = JsonStore(tmp_path / "b.json")
    ents = a.entries()
    changed = Entry(ents[0].key, {**ents[0].tile, "BLOCK_N": 999}, 0.5, [], {}, "2026-01-01T00:00:00Z")
    b.put(changed)
    b.put(ents[1])
    rep = merge(a, b)
    assert rep["identical"] == 1 and rep["added"] == 0 and len(rep["conflicts"]) == 1
    c = rep["conflicts"][0]
    assert c["existing"] == ents[0].tile and c["incoming"]["BLOCK_N"] == 999 and c["kept"] == "existing"
    assert a.get(ents[0].digest).tile == ents[0].tile
    rep = merge(a, b, prefer_incoming=True)
    assert rep["replaced"] == 1 and a.get(ents[0].digest).tile["BLOCK_N"] == 999


def _broken_files(tmp_path):
    tuned_db(tmp_path / "good.db")
    export_json(open_store(tmp_path / "good.db"), tmp_path / "good.json")
    raw = (tmp_path / "good.db").read_bytes()
    out = {}
    (tmp_path / "trunc.db").write_bytes(raw[:60])
    out["trunc.db"] = "truncated"
    (tmp_path / "trunc2.db").write_bytes(raw[: len(raw) // 2])
    out["trunc2.db"] = "truncated or corrupt|corrupt"
    bad = bytearray(raw)
    bad[100:4096] = b"\xa5" * (4096 - 100)
    (tmp_path / "corrupt.db").write_bytes(bytes(bad))
    out["corrupt.db"] = "corrupt"
    (tmp_path / "notsqlite.db").write_bytes(b"hello world, this is not a database" * 10)
    out["notsqlite.db"] = "not an SQLite file"
    con = sqlite3.connect(tmp_path / "foreign.db")
    con.execute("CREATE TABLE users (id INTEGER)")
    con.commit()
    con.close()
    out["foreign.db"] = "foreign schema"
    txt = (tmp_path / "good.json").read_text()
    (tmp_path / "trunc.json").write_text(txt[: len(txt) // 2])
    out["trunc.json"] = "truncated or corrupt"
    (tmp_path / "foreign.json").write_text(json.dumps({"tiles": []}))
    out["foreign.json"] = "foreign schema"
    (tmp_path / "future.json").write_text(txt.replace('"schema_version": 1', '"schema_version": 7'))
    out["future.json"] = "schema version 7"
    return out


def test_broken_files_are_detected_and_the_miss_policy_applies(tmp_path):
    import re
    cases = _broken_files(tmp_path)
    p = problems()[0]
    default = FAKE_DENSE.default_tile(p)
    for name, pattern in cases.items():
        path = tmp_path / name
        with pytest.raises(CacheError, match=pattern) as ei:
            open_store(path, create=False)
        assert name in str(ei.value)
        # policy "error": fatal, with the reason
        with pytest.raises(CacheError, match=re.escape(name)):
            TileResolver(path, "error", "cpu", identity=CPU, timer=no_timer)
        # policy "default": a warning naming the file, then default tiles, untimed
        with pytest.warns(UserWarning, match=re.escape(name)):
            r = TileResolver(path, "default", "cpu", identity=CPU, timer=no_timer)
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            assert r.tile(FAKE_DENSE, p) == default
            assert r.tile(FAKE_DENSE, p) == default  # warned once per key
        assert len([x for x in w if "miss" in str(x.message)]) == 1 and r.timing_calls == 0
        # policy "tune": tunes in memory, never overwrites the broken file
        before = path.read_bytes()
        with pytest.warns(UserWarning, match="memory"):
            r = TileResolver(path, "tune", "cpu", identity=CPU, timer=fake_timer)
        assert r.tile(FAKE_DENSE, p)["BLOCK_K"] == 64 and r.timing_calls > 0
        assert path.read_bytes() == before


def test_other_device_cache_is_detected(tmp_path):
    tuned_db(tmp_path / "h200.db", identity=H200)
    with pytest.raises(CacheError, match="NVIDIA H200.*none for this device.*other device"):
        TileResolver(tmp_path / "h200.db", "error", "cpu", identity=H100, timer=no_timer)
    with pytest.warns(UserWarning, match="other device"):
        r = TileResolver(tmp_path / "h200.db", "default", "cpu", identity=H100, timer=no_timer)
    p = problems()[0]
    with pytest.warns(UserWarning, match="miss"):
        assert r.tile(FAKE_DENSE, p) == FAKE_DENSE.default_tile(p)
    # "tune" still records into the file, for this device, beside the other device's tiles
    with pytest.warns(UserWarning, match="other device"):
        r = TileResolver(tmp_path / "h200.db", "tune", "cpu", identity=H100, timer=fake_timer)
    r.tile(FAKE_DENSE, p)
    assert open_store(tmp_path / "h200.db").devices() == {H200.key(), H100.key()}


def test_error_policy_names_the_key_and_a_missing_file(tmp_path):
    tuned_db(tmp_path / "c.db", ps=problems(Ns=(40,)))
    r = TileResolver(tmp_path / "c.db", "error", "cpu", identity=CPU)
    with pytest.raises(CacheMiss, match=r"fake_dense N=72 K=64 bucket=1"):
        r.tile(FAKE_DENSE, problems(Ns=(72,))[0])
    with pytest.raises(CacheError, match="does not exist"):
        TileResolver(tmp_path / "missing.db", "error", "cpu", identity=CPU)


def test_shipped_cache_is_picked_by_exact_identity(tmp_path):
    nvl = DeviceIdentity("nvidia", "NVIDIA H200 NVL", (9, 0), None, 132)
    fewer = DeviceIdentity("nvidia", "NVIDIA H200", (9, 0), None, 114)
    for ident, name in ((nvl, "a-nvidia-h200-nvl.json"), (H200, "b-nvidia-h200.json"), (fewer, "a-nvidia-h200.json")):
        tuned_db(tmp_path / "t.db", identity=ident)
        export_json(open_store(tmp_path / "t.db"), tmp_path / name)
        (tmp_path / "t.db").unlink()
    assert shipped_cache_for(H200, [tmp_path]).name == "b-nvidia-h200.json"
    assert shipped_cache_for(nvl, [tmp_path]).name == "a-nvidia-h200-nvl.json"
    assert shipped_cache_for(fewer, [tmp_path]).name == "a-nvidia-h200.json"
    assert shipped_cache_for(H100, [tmp_path]) is None


def test_no_cache_named_reads_the_shipped_file_read_only(tmp_path, monkeypatch):
    tuned_db(tmp_path / "t.db", identity=CPU)
    ship = tmp_path / "ship"
    ship.mkdir()
    export_json(open_store(tmp_path / "t.db"), ship / "x86.json")
    before = (ship / "x86.json").read_bytes()
    monkeypatch.setenv("VSR_AUTOTUNE_CACHES", str(ship))
    r = TileResolver(None, "tune", "cpu", identity=CPU, timer=fake_timer)
    assert r.cache_path == ship / "x86.json" and r.read_only
    p = problems()[0]
    assert r.tile(FAKE_DENSE, p)["BLOCK_K"] == 64 and r.timing_calls == 0
    other = problems(Ns=(104,))[0]
    r.tile(FAKE_DENSE, other)  # a miss under "tune": tuned in memory, the shipped file untouched
    assert r.timing_calls > 0 and (ship / "x86.json").read_bytes() == before
    assert not (ship / "x86.json.locks").exists()
    r = TileResolver(None, "default", "cpu", identity=CPU, use_shipped=False)
    assert r.cache_path is None and r.store is None


def test_misses_do_not_reparse_an_unchanged_json(tmp_path, monkeypatch):
    tuned_db(tmp_path / "t.db", identity=CPU)
    export_json(open_store(tmp_path / "t.db"), tmp_path / "c.json")
    r = TileResolver(tmp_path / "c.json", "default", "cpu", identity=CPU)
    reads = []
    orig = JsonStore._read
    monkeypatch.setattr(JsonStore, "_read", lambda self: reads.append(1) or orig(self))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for p in problems(Ns=(8, 16, 24)):
            r.tile(FAKE_DENSE, p)
    assert reads == []


def test_a_creation_cut_short_leaves_no_half_made_cache(tmp_path, monkeypatch):
    db = tmp_path / "new.db"

    def killed():
        raise KeyboardInterrupt  # stands in for a kill between writing the header and the tables
    monkeypatch.setattr(store_mod, "now_utc", killed)
    with pytest.raises(KeyboardInterrupt):
        SqliteStore(db)
    monkeypatch.undo()
    assert not db.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["new.db.lock"]
    s = SqliteStore(db)  # a later process creates it normally
    assert s.entries() == [] and s.integrity_check() == "ok"
    assert s.db.conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_a_key_recorded_meanwhile_wins_over_the_tile_just_tuned(tmp_path, monkeypatch):
    # Another process records the key between our re-read and our write (it reached the file by
    # another path, so it held another per-key lock): we must serve the recorded tile, not ours.
    db = tmp_path / "c.db"
    p = problems()[0]
    r = TileResolver(db, "tune", "cpu", identity=CPU, timer=fake_timer)
    key = r.key(FAKE_DENSE, p)
    theirs = Entry(key, {**FAKE_DENSE.default_tile(p), "BLOCK_N": 32, "BLOCK_K": 16}, 2.0, [], {}, "")
    orig_put = SqliteStore.put

    def put_after_the_other(self, entry, *, replace=False):
        orig_put(self, theirs)
        return orig_put(self, entry, replace=replace)
    monkeypatch.setattr(SqliteStore, "put", put_after_the_other)
    assert r.tile(FAKE_DENSE, p) == theirs.tile and r.tuned == []
    monkeypatch.undo()
    assert open_store(db).get(key.digest()).tile == theirs.tile


def test_a_write_takes_the_write_lock_before_it_reads(tmp_path, monkeypatch):
    # A deferred BEGIN would let another connection commit between put's check and its write,
    # and the write would then fail at once ("database is locked"; no busy wait covers it).
    db = tmp_path / "c.db"
    s = SqliteStore(db)
    p = problems()[0]
    e = Entry(TileResolver(db, "default", "cpu", identity=CPU).key(FAKE_DENSE, p), FAKE_DENSE.default_tile(p))
    other = sqlite3.connect(db, timeout=0, isolation_level=None)
    blocked = []
    orig_get = SqliteStore.get

    def get_while_another_writes(self, digest):
        try:
            other.execute("INSERT INTO meta VALUES ('other', 'writer')")
        except sqlite3.OperationalError as err:
            blocked.append(str(err))
        return orig_get(self, digest)
    monkeypatch.setattr(SqliteStore, "get", get_while_another_writes)
    assert s.put(e) and blocked and "locked" in blocked[0]
    monkeypatch.undo()
    assert s.get(e.digest).tile == e.tile
    # A writer that holds the file past the busy timeout: a CacheError naming the file, nothing written.
    s.db.conn.execute("PRAGMA busy_timeout=0")
    other.execute("BEGIN IMMEDIATE")
    with pytest.raises(CacheError, match=r"c\.db.*locked"):
        s.delete([e.digest])
    other.execute("ROLLBACK")
    assert not s.db.conn.in_transaction and s.get(e.digest) is not None
    other.close()


def test_any_sqlite_error_in_a_write_is_a_cache_error(tmp_path):
    # Not only "locked" (OperationalError): a malformed file's DatabaseError is the file's problem too.
    tuned_db(tmp_path / "c.db")
    s = SqliteStore(tmp_path / "c.db")
    digest = s.entries()[0].digest
    real = s.db.conn

    class Malformed:
        in_transaction = False

        def execute(self, sql, *a):
            if sql.startswith("BEGIN"):
                return real.execute(sql, *a)
            raise sqlite3.DatabaseError("database disk image is malformed")

        def executemany(self, sql, *a):
            return self.execute(sql, *a)

        def __getattr__(self, name):
            return getattr(real, name)
    s.db.conn = Malformed()
    try:
        with pytest.raises(CacheError, match=r"c\.db.*malformed"):
            s.delete([digest])
    finally:
        real.execute("ROLLBACK") if real.in_transaction else None
        s.db.conn = real
    assert s.get(digest) is not None


def test_delete_takes_more_digests_than_sqlite_binds_in_one_statement(tmp_path):
    tuned_db(tmp_path / "c.db")
    s = SqliteStore(tmp_path / "c.db")
    if hasattr(s.db.conn, "setlimit"):  # Python 3.11+: bind no more than SQLite before 3.32 allowed
        s.db.conn.setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, 999)
    ents = s.entries()
    absent = [f"{i:024x}" for i in range(1500)]
    assert s.delete(absent + [ents[0].digest, ents[1].digest]) == 2
    assert {e.digest for e in s.entries()} == {e.digest for e in ents[2:]}
    assert s.delete([]) == 0 and s.delete(absent) == 0


def test_new_cache_files_follow_the_umask(tmp_path):
    import os
    import stat

    old = os.umask(0o027)
    store_mod._umask.cache_clear()
    try:
        tuned_db(tmp_path / "c.db")
        export_json(open_store(tmp_path / "c.db"), tmp_path / "c.json")
        JsonStore(tmp_path / "d.json").put(open_store(tmp_path / "c.db").entries()[0])
        for name in ("c.db", "c.json", "d.json"):
            assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o640, name
    finally:
        os.umask(old)
        store_mod._umask.cache_clear()


def test_a_tile_the_store_lost_is_not_served_as_recorded(tmp_path, monkeypatch):
    # put says the key is present, but a re-read finds nothing (removed meanwhile): the tile
    # just tuned is in no file, so it is an error, not a tuned key.
    db = tmp_path / "c.db"
    r = TileResolver(db, "tune", "cpu", identity=CPU, timer=fake_timer)
    monkeypatch.setattr(SqliteStore, "put", lambda self, entry, *, replace=False: False)
    with pytest.raises(CacheError, match="no longer holds it"):
        r.tile(FAKE_DENSE, problems()[0])
    assert r.tuned == [] and open_store(db).entries() == []


def test_write_atomic_replaces_whole_or_not_at_all(tmp_path, monkeypatch):
    # The results writers and the JSON export rely on it: the new text whole, no temporary file
    # left, and on a failure mid-write the previous file as it was.
    path = tmp_path / "sub" / "out.json"
    store_mod.write_atomic(path, "first")
    store_mod.write_atomic(path, "second")
    assert path.read_text() == "second" and sorted(p.name for p in path.parent.iterdir()) == ["out.json"]

    def fail(*a, **k):
        raise OSError("disk full")
    monkeypatch.setattr(store_mod.os, "replace", fail)
    with pytest.raises(OSError, match="disk full"):
        store_mod.write_atomic(path, "third")
    assert path.read_text() == "second" and sorted(p.name for p in path.parent.iterdir()) == ["out.json"]


def test_a_stated_digest_that_does_not_match_its_key_is_refused_when_used(tmp_path):
    db = tmp_path / "a.db"
    tuned_db(db)
    export_json(open_store(db), tmp_path / "a.json")
    doc = json.loads((tmp_path / "a.json").read_text())
    good = doc["entries"][1]["digest"]
    doc["entries"][0]["key"]["N"] += 1     # the key edited, its stated digest left as it was
    bad = doc["entries"][0]["digest"]
    (tmp_path / "a.json").write_text(json.dumps(doc))
    s = JsonStore(tmp_path / "a.json", create=False)   # loading checks structure only
    assert s.get(good).digest == good
    with pytest.raises(CacheError, match="entry 0 is malformed.*does not match its key"):
        s.get(bad)
    with pytest.raises(CacheError, match="does not match its key"):
        JsonStore(tmp_path / "a.json", create=False).entries()
    with pytest.raises(CacheError, match="does not match its key"):
        JsonStore(tmp_path / "a.json", create=False).put(Entry.from_json(doc["entries"][1] | {"digest": good}),
                                                        replace=True)
