"""Test set-up shared by every test module.

Without a GPU the kernels run under the Triton interpreter; the variable must be
set before any @triton.jit function is defined, so it is set here, first.
"""
import importlib.util
import os
import sys
from pathlib import Path

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import pytest  # noqa: E402


def pytest_configure(config):
    """Refuse, with the reason, an interpreter that cannot run the kernels (rather than fail
    every kernel test with the same cryptic error)."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        return
    import numpy
    import triton
    from packaging.version import Version
    # Triton 3.6's interpreter takes a loop bound from a one-element array with int(), which
    # numpy 2.4 refuses ("only 0-dimensional arrays can be converted to Python scalars");
    # Triton 3.7 squeezes the array first.
    if Version(triton.__version__) < Version("3.7") and Version(numpy.__version__) >= Version("2.4"):
        raise pytest.UsageError(
            f"Triton {triton.__version__}'s interpreter cannot run the kernels with numpy {numpy.__version__}: "
            "install numpy<2.4 beside it (pip install 'numpy<2.4'), or Triton 3.7 or later")


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


def pytest_collection_finish(session):
    """A module with compiling processes to run (start_background_probes) starts them now, for its
    selected tests, so they run beside the modules collected before it."""
    modules = {}
    for item in session.items:
        start = getattr(getattr(item, "module", None), "start_background_probes", None)
        if start is not None:
            modules.setdefault(start, []).append(item)
    for start, items in modules.items():
        start(items)


BENCH = Path(__file__).resolve().parent.parent / "benchmarks"


@pytest.fixture(scope="session")
def bench_script():
    """load(name): benchmarks/<name>.py as a fresh module (benchmarks/ put on sys.path for the
    scripts' own `common_bench` import), for tests of the scripts' orchestration on the CPU."""
    def load(name: str):
        if str(BENCH) not in sys.path:
            sys.path.insert(0, str(BENCH))
        spec = importlib.util.spec_from_file_location(f"vsr_bench_{name}", BENCH / f"{name}.py")
        mod = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mod   # as importlib's recipe does: a dataclass looks its module up there
        spec.loader.exec_module(mod)
        return mod
    return load


@pytest.fixture(scope="session")
def run_each_once():
    """timer(result, timed=None): a CPU stand-in for a benchmark's timing function, which takes a
    list of calls: it runs each call once (so every case is built, run and checked), appends how
    many calls it got to `timed` when given, and returns `result` in place of a time."""
    def timer(result, timed=None):
        def run(fns, *args, **kwargs):   # a timer's further options (warm_ms, ...) have no stand-in
            for f in fns:
                f()
            if timed is not None:
                timed.append(len(fns))
            return result
        return run
    return timer
