"""The intent split: deterministic, roughly the documented size, held-out names held out."""

import re

import pytest

from vsr.runtime import intents


@pytest.fixture(scope="module")
def split(tmp_path_factory):
    # A fresh generation (not a cache hit), so the generator itself is tested.
    return intents.load_split(use_cache=False)


def test_split_is_deterministic_and_sized(split):
    again = intents.load_split(use_cache=False)
    assert again == split
    assert 27_000 <= len(split["train"]) <= 34_000
    assert 11_000 <= len(split["test"]) <= 15_000


def test_labels_merge_the_shopping_list_duplicates(split):
    labels = intents.labels()
    assert len(labels) == 40
    for dup, keep in intents.MERGED.items():
        assert dup not in labels and keep in labels
    used = {e.label for e in split["train"]}
    assert used == set(labels)
    assert {e.label for e in split["test"]} <= set(labels)


def test_no_text_in_both_splits_or_under_two_labels(split):
    train = {e.text: e.label for e in split["train"]}
    assert len(train) == len(split["train"])
    test = [e.text for e in split["test"]]
    assert len(set(test)) == len(test)
    assert not set(train) & set(test)


def _mentions(text: str, value: str) -> bool:
    return re.search(rf"(^|\W){re.escape(value)}($|\W)", text) is not None


def test_held_out_values_never_reach_training(split):
    train_values = set(intents.AREAS[0]) | set(intents.FLOORS[0])
    for tr, _ in list(intents.NAMES.values()) + list(intents.WILDCARDS.values()):
        train_values |= set(tr)
    held = {v for vals in intents.held_out_values().values() for v in vals}
    assert not held & train_values, "a value is in both the train and the test list"

    # Multi-word held-out names (single words like "den" can occur inside
    # template text) never appear in a training sentence ...
    distinctive = sorted(v for v in held if " " in v)
    train_text = "\n".join(e.text for e in split["train"])
    leaked = [v for v in distinctive if _mentions(train_text, v)]
    assert not leaked, f"held-out names in training sentences: {leaked[:5]}"
    # ... and the test split does name them.
    test_text = "\n".join(e.text for e in split["test"])
    named = [v for v in distinctive if _mentions(test_text, v)]
    assert len(named) >= 0.8 * len(distinctive)


def test_cache_round_trip(tmp_path, monkeypatch, split):
    monkeypatch.setenv("VSR_CACHE_DIR", str(tmp_path))
    # The generator is tested above; here only the cache, so reuse its output.
    monkeypatch.setattr(intents, "_generate", lambda: split)
    first = intents.load_split()
    monkeypatch.setattr(intents, "_generate", lambda: pytest.fail("cache missed"))
    assert list((tmp_path / "intents").glob("split-*.json"))
    assert intents.load_split() == first == split
