"""autotune.startup_memo: Triton's installation hash and the kernels' source hashes, memoised
across processes under stamps of what they derive from; a memo never changes a value."""
import json

import pytest

import triton.runtime.cache as tcache
from vsr.autotune import keys, startup_memo
from vsr.kernels import registry


@pytest.fixture
def memo_root(tmp_path):
    yield tmp_path / "cache"
    _fresh_process_state()


def _fresh_process_state():
    """What a new process starts from: no memo in memory, Triton's own triton_key."""
    startup_memo.disable()
    keys.kernel_source_hash.cache_clear()
    keys._raw_source_digest.cache_clear()


def test_triton_key_memo_gives_tritons_value_and_is_read_back(memo_root):
    original = tcache.triton_key
    expected = original()
    startup_memo.enable(memo_root)
    assert tcache.triton_key is not original and tcache.triton_key() == expected
    doc = json.loads((memo_root / startup_memo.FILE).read_text())
    assert list(doc["triton_key"].values()) == [expected]
    # A later process reads the memo: Triton's own hash is not run again.
    _fresh_process_state()
    assert tcache.triton_key is original
    stamp = startup_memo.triton_install_stamp()
    doc["triton_key"][stamp] = "memoised-value"
    (memo_root / startup_memo.FILE).write_text(json.dumps(doc))
    startup_memo.enable(memo_root)
    assert tcache.triton_key() == "memoised-value"
    startup_memo.disable()
    assert tcache.triton_key is original


def test_install_stamp_is_stable_and_covers_libtriton():
    a, b = startup_memo.triton_install_stamp(), startup_memo.triton_install_stamp()
    assert a == b and len(a) == 64


def test_source_hash_memo_equals_the_computed_hash(memo_root):
    templates = list(registry.TEMPLATES.values())[:4]
    computed = [keys.kernel_source_hash(t) for t in templates]
    _fresh_process_state()
    startup_memo.enable(memo_root)
    assert [keys.kernel_source_hash(t) for t in templates] == computed   # computed, then written
    doc = json.loads((memo_root / startup_memo.FILE).read_text())
    assert sorted(doc["source_hash"].values()) == sorted(set(computed))
    # A later process takes the memo under the same raw sources (a planted value shows it is read).
    stamp = next(k for k, v in doc["source_hash"].items() if v == computed[0])
    doc["source_hash"][stamp] = "planted"
    (memo_root / startup_memo.FILE).write_text(json.dumps(doc))
    _fresh_process_state()
    startup_memo.enable(memo_root)
    assert keys.kernel_source_hash(templates[0]) == "planted"


def test_changed_source_misses_the_memo(memo_root, monkeypatch):
    t = next(iter(registry.TEMPLATES.values()))
    startup_memo.enable(memo_root)
    before = keys.kernel_source_hash(t)
    doc = json.loads((memo_root / startup_memo.FILE).read_text())
    doc["source_hash"] = {k: "planted" for k in doc["source_hash"]}
    (memo_root / startup_memo.FILE).write_text(json.dumps(doc))
    _fresh_process_state()
    startup_memo.enable(memo_root)
    assert keys.kernel_source_hash(t) == "planted"          # unchanged sources: the memo is read
    # A comment added to every module: other raw bytes, so a miss, and the code text (comments
    # dropped) hashes as before.
    _fresh_process_state()
    startup_memo.enable(memo_root)
    real = keys.Path.read_bytes
    monkeypatch.setattr(keys.Path, "read_bytes", lambda self: real(self) + b"\n# edited\n")
    assert keys.kernel_source_hash(t) == before


@pytest.mark.parametrize("content", ["", "{not json", json.dumps({"kind": "other"}),
                                     json.dumps({"kind": startup_memo.KIND, "triton_key": [], "source_hash": {}})])
def test_unreadable_memo_is_a_miss(memo_root, content):
    t = next(iter(registry.TEMPLATES.values()))
    expected = keys.kernel_source_hash(t)
    _fresh_process_state()
    memo_root.mkdir(parents=True)
    (memo_root / startup_memo.FILE).write_text(content)
    startup_memo.enable(memo_root)
    assert keys.kernel_source_hash(t) == expected
    assert json.loads((memo_root / startup_memo.FILE).read_text())["kind"] == startup_memo.KIND
