"""open_engine: a package opened with every check vsr-run makes, then its engine loaded.

Order: open the package (name -> config.json -> device check before any weight is read ->
identity and revision check) -> load the engine -> refuse an engine whose mode contradicts the
device check (an emulated package must run emulated). `vsr-run` and `vsr-run serve` both open
packages through this one function, so the service refuses exactly what the CLI refuses.
"""
from __future__ import annotations

from vsr.runtime.errors import PackageError


def open_engine(package: str, *, device: str, revision: str | None = None, allow_unverified: bool = False,
                dtype: str = "auto", emulate: bool = False, autotune_cache=None, miss_policy: str = "default",
                cuda_graphs: bool | None = None):
    """(OpenedPackage, Engine) for `package` on `device`; raises DeviceRefusal or PackageError."""
    from vsr.runtime.package import open_package
    pkg = open_package(package, revision=revision, allow_unverified=allow_unverified, device=device, emulate=emulate)
    try:
        from vsr.runtime.engine import load_engine
    except ImportError as e:
        raise PackageError(f"the inference engine (vsr.runtime.engine) is not available in this install: {e}")
    engine = load_engine(pkg, device=device, dtype=dtype, emulate=emulate, autotune_cache=autotune_cache,
                         miss_policy=miss_policy, cuda_graphs=cuda_graphs)
    if pkg.support == "emulated" and engine.mode != "emulated":
        raise PackageError(f"the device check chose the emulation but the engine runs {engine.mode!r}; refusing "
                           "to label its answers wrongly")
    return pkg, engine
