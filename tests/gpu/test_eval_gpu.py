"""On a GPU: `vsr-run eval` records a quantized package's approximate kernel set against the same
package on the exact set (issue 38 point 3). Needs the built-in packages built on this machine."""
from __future__ import annotations

import pytest

from vsr.runtime import builtin, evaluate

pytestmark = pytest.mark.gpu


def test_approximate_set_is_recorded_against_the_exact_set():
    for name in (builtin.BASE, builtin.BASE + "-W4A16-GPTQ"):
        if not builtin.is_built(name):
            pytest.skip(f"{name} is not built on this machine (vsr-run {name} --text hi builds it)")
    rec = evaluate.evaluate([builtin.BASE + "-W4A16-GPTQ"], limit=64, device="cuda", compare_st=False)
    gptq, = rec["rows"]
    assert gptq["mode"] == "triton" and gptq["kernel_set"] == "approximate"
    assert 0.95 <= gptq["exact_set_agreement"] <= 1.0
    assert 0 <= gptq["exact_set_max_prob_diff"] < 0.05
    assert "approximate (" in evaluate.format_table(rec)
    assert gptq["agreement"] >= 0.9   # against the fp32 package
