"""benchmarks/bench_attention.py's CPU side: every form it times computes attention (against the
reference, under the interpreter) and the kernel's shipped form is restored after each case."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))


@pytest.fixture
def bench(monkeypatch):
    import bench_attention

    monkeypatch.setattr(bench_attention, "HQ", 4)
    monkeypatch.setattr(bench_attention, "HKV", 2)
    monkeypatch.setattr(bench_attention, "graph_ms", lambda fns: (fns[0](), 1.0)[1])
    return bench_attention


def test_every_form_is_attention_and_the_shipped_form_comes_back(bench):
    from vsr.kernels import attention as A

    config, skip_from, hf_from = A._config, A.SKIP_MASK_FROM, A.HEADS_FIRST_FROM
    row = bench.run_case(2, 70, "cpu")
    names = {"one", "two", "one_n32", "one_m128"}
    assert set(row["err"]) == names | {n + "_hf" for n in names}, row
    assert all(e < 1e-2 for e in row["err"].values()), row
    assert row["shipped"] == [32, False, False] and all(row[n + "_us"] == 1e3 for n in row["err"])
    assert A._config is config and A.SKIP_MASK_FROM == skip_from and A.HEADS_FIRST_FROM == hf_from
    assert "one_n32" not in bench.forms(512)
    assert bench.forms(512)["two_n128_hf"] == {"skip_from": 1, "block_n": 128, "heads_first": True}
