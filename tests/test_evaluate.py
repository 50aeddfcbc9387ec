"""The record: figures on a small spread of the test split, the table and the JSON."""

import json

import pytest

from vsr.runtime import builtin, evaluate


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("VSR_CACHE_DIR", str(tmp_path_factory.mktemp("vsr-cache")))
    yield
    mp.undo()


def test_record_of_the_base_package(cache, tmp_path):
    rec = evaluate.evaluate([builtin.BASE, builtin.BASE + "-FP8"], limit=48, speed_requests=16,
                            speed_rounds=1)
    assert rec["test_sentences"] == 48 and rec["speed_requests"] == 16
    base, fp8 = rec["rows"]
    assert base["package"] == builtin.BASE and base["mode"] == "reference"
    assert base["kernel_set"] == "exact" and "exact_set_agreement" not in base   # the CPU runs the exact set
    assert base["agreement"] == 1.0  # against itself
    assert 0.6 < base["accuracy"] <= 1.0  # the head is far better than chance (1/40)
    assert base["weight_bytes"] > 80e6  # fp32 MiniLM
    assert base["requests_per_s"] > 0 and base["st_requests_per_s"] > 0
    # sentence-transformers with the same head answers like the package.
    assert rec["st_agreement_with_base"] >= 0.9
    # FP8 without the opt-in emulation on a CPU: refused with the device check's sentence.
    assert "FP8 weights need" in fp8["refused"]

    table = evaluate.format_table(rec)
    assert table.splitlines()[0].startswith("| Format | Weights | Activations")
    assert "| vsr/intent-minilm | FP32 | FP32 |" in table and "refused" in table

    path = evaluate.write_record(rec, tmp_path)
    assert path.name.startswith("record-cpu-")
    assert json.loads(path.read_text())["rows"][0]["accuracy"] == base["accuracy"]


def test_speed_is_timed_beside_the_against_package(cache):
    # The base package by its folder: another name, so its row is timed beside the base's engine.
    folder = str(builtin.resolve(builtin.BASE))
    rec = evaluate.evaluate([builtin.BASE, folder], limit=16, speed_requests=8, speed_rounds=2)
    base, again = rec["rows"]
    assert "speed_vs_against" not in base
    assert again["against_requests_per_s"] > 0 and again["speed_vs_against"] > 0
    assert again["paired_requests_per_s"] > 0
    assert again["speed_vs_against"] == pytest.approx(again["paired_requests_per_s"] / again["against_requests_per_s"])
    assert f"| {again['speed_vs_against']:.2f}x |" in evaluate.format_table(rec)


def test_spread_subset_covers_many_intents():
    test = evaluate._test_split(80)
    assert len(test) == 80 and len({e.label for e in test}) >= 30


def test_table_names_the_approximate_set_and_its_agreement():
    row = {"package": "p", "format": "fp8", "weight_bytes": 1, "accuracy": 0.9, "mode": "triton",
           "kernel_set": "approximate", "exact_set_agreement": 0.9975, "exact_set_max_prob_diff": 0.01}
    table = evaluate.format_table({"rows": [row, dict(row, kernel_set="exact")]})
    assert "| triton, approximate (99.75% of the exact set's) |" in table.splitlines()[2]
    assert table.splitlines()[3].endswith("| triton |")


def test_record_commit_is_vsr_commit_when_set(monkeypatch):
    # A device is sent the working tree over an older git checkout: VSR_COMMIT names what it holds.
    monkeypatch.setenv("VSR_COMMIT", "abc1234")
    assert evaluate._commit() == "abc1234"
    monkeypatch.delenv("VSR_COMMIT")
    assert evaluate._commit() != "abc1234"


def test_pairs_swap_their_order_each_round(monkeypatch):
    calls, clock = [], iter(range(100))
    monkeypatch.setattr(evaluate.time, "perf_counter", lambda: next(clock))
    a, b = evaluate._paired(lambda t: calls.append("a"), lambda t: calls.append("b"), ["x"], 3)
    assert calls == ["a", "b", "b", "a", "a", "b"]
    assert (a, b) == (1, 1)   # each timing spans one tick of the fake clock
