"""Compiled-kernel bundles (autotune/bundle.py) on the CPU, through Triton's real cache path.

Triton's interpreter compiles nothing, so the kernels here are compiled for an sm_90 target with
triton.compile on the CPU (tests/bundle_probe.py, each run a fresh process with its own empty
TRITON_CACHE_DIR): that writes and reads real Triton cache entries, the same lookup the JIT makes
on a GPU, and Triton's C-module builder writes a real launcher-style .so. Checked: a bundle of
those entries serves a fresh process with no compile and no build and the same binaries; its
manifest keys it (device, Triton, Python, source hashes, each file's sha256) and holds no IR
text; a miss compiles by JIT with one warning; a bundle of another device or Triton version, or a
corrupt one, is refused with the reason and never loaded, and the process still compiles.
"""
from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
import warnings
from pathlib import Path

import pytest
import triton
from click.testing import CliRunner

from vsr.autotune import bundle
from vsr.autotune.device_id import DeviceIdentity

PROBE = Path(__file__).with_name("bundle_probe.py")
H200 = DeviceIdentity("nvidia", "NVIDIA H200", (9, 0), None, 132)
OTHER = DeviceIdentity("nvidia", "NVIDIA A100-SXM4-80GB", (8, 0), None, 108)


def probe(kernels: str, cache_dir: Path, *bundle_args) -> dict:
    env = dict(os.environ, TRITON_CACHE_DIR=str(cache_dir), TRITON_INTERPRET="0", TRITON_DEFAULT_FP_FUSION="1")
    env.pop("TRITON_CACHE_MANAGER", None)
    p = subprocess.run([sys.executable, str(PROBE), kernels, *map(str, bundle_args)], capture_output=True,
                       text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def groups_written(cache_dir: Path) -> list[str]:
    return sorted(p.name for p in cache_dir.glob("*/__grp__*")) if cache_dir.is_dir() else []


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """A Triton cache dir written by one process compiling twice_kernel, its bundle for the H200,
    and the binaries each kernel compiles to without a bundle."""
    tmp = tmp_path_factory.mktemp("bundle")
    base = probe("twice", tmp / "compiled")
    square = probe("square", tmp / "square-jit")["cubins"]["square"]
    path = tmp / "caches" / bundle.default_name("nvidia-h200", triton.__version__)
    manifest = bundle.write_bundle(tmp / "compiled", path, identity=H200, triton_version=triton.__version__,
                                   source_hashes={"dense": "0123abcd"}, keys=["k1", "k2"])
    return {"tmp": tmp, "path": path, "manifest": manifest, "cubins": {**base["cubins"], "square": square}}


def test_round_trip_serves_a_fresh_process_without_compiling(built, tmp_path):
    got = probe("twice", tmp_path / "empty", built["path"], H200.key(), tmp_path / "root")
    assert got["refused"] is None and got["warnings"] == []
    assert got["stats"]["compiles"] == 0 and got["stats"]["builds"] == 0 and got["stats"]["bundle_misses"] == 0
    assert got["stats"]["bundle_hits"] >= 2            # the kernel and the C module
    assert got["cubins"]["twice"] == built["cubins"]["twice"]
    assert groups_written(tmp_path / "empty") == []   # nothing compiled into Triton's own cache dir
    # unpacked once: a second process reuses the unpacked entries
    assert len(list((tmp_path / "root").iterdir())) == 1
    again = probe("twice", tmp_path / "empty2", built["path"], H200.key(), tmp_path / "root")
    assert again["stats"]["compiles"] == 0 and len(list((tmp_path / "root").iterdir())) == 1


def test_manifest_keys_the_bundle(built):
    m = built["manifest"]
    assert m["kind"] == bundle.KIND and m["device"] == H200.key() and m["triton"] == triton.__version__
    assert m["python"] == bundle.python_tag() and m["source_hashes"] == {"dense": "0123abcd"}
    assert m["cache_keys"] == ["k1", "k2"] and m["kernels"] == 1
    # the entries are Triton's own key directories, each file listed with its checksum
    triton_keys = {p.name for p in (built["tmp"] / "compiled").iterdir() if p.is_dir()}
    assert {n.split("/")[0] for n in m["files"]} == triton_keys
    names = [n.split("/")[1] for n in m["files"]]
    assert "twice_kernel.cubin" in names and "twice_kernel.json" in names and any(n.endswith(".so") for n in names)
    assert not any(n.endswith((".ptx", ".llir", ".ttir", ".ttgir", ".source")) for n in names)
    assert bundle.read_manifest(built["path"]) == m


def test_a_miss_compiles_by_jit_with_one_warning(built, tmp_path):
    got = probe("twice,square,square", tmp_path / "c", built["path"], H200.key(), tmp_path / "root")
    assert got["refused"] is None
    assert len(got["warnings"]) == 1 and "square_kernel" in got["warnings"][0] and "JIT" in got["warnings"][0]
    assert got["stats"]["compiles"] == 1
    assert got["cubins"] == {"twice": built["cubins"]["twice"], "square": built["cubins"]["square"]}


@pytest.mark.parametrize("case", ["other-device", "other-triton"])
def test_a_bundle_of_another_device_or_triton_is_refused(built, tmp_path, case):
    path = built["path"]
    ident = OTHER.key() if case == "other-device" else H200.key()
    if case == "other-triton":
        path = tmp_path / "old.bundle.tar.gz"
        bundle.write_bundle(built["tmp"] / "compiled", path, identity=H200, triton_version="3.0.0", source_hashes={})
    got = probe("twice", tmp_path / "c", path, ident, tmp_path / "root")
    assert got["refused"].endswith("other device" if case == "other-device" else "other Triton version")
    assert ("A100" in got["refused"] and "H200" in got["refused"]) or "3.0.0" in got["refused"]
    assert not (tmp_path / "root").exists()                    # never unpacked
    assert groups_written(tmp_path / "c") == ["__grp__twice_kernel.json"]   # compiled by JIT
    assert got["cubins"]["twice"] == built["cubins"]["twice"]


def _rewrite(src: Path, dst: Path, change) -> None:
    with tarfile.open(src, "r:gz") as tin, tarfile.open(dst, "w:gz") as tout:
        for m in tin:
            data = tin.extractfile(m).read()
            data = change(m.name, data)
            if data is None:
                continue
            info = tarfile.TarInfo(m.name)
            info.size = len(data)
            tout.addfile(info, io.BytesIO(data))


def _flip_cubin(name, data):
    return data[:100] + bytes([data[100] ^ 1]) + data[101:] if name.endswith(".cubin") else data


@pytest.mark.parametrize("how", ["flipped-byte", "missing-file", "truncated", "not-a-bundle"])
def test_a_corrupt_bundle_is_refused_and_the_process_still_compiles(built, tmp_path, how):
    bad = tmp_path / f"{how}.bundle.tar.gz"
    if how == "flipped-byte":
        _rewrite(built["path"], bad, _flip_cubin)
    elif how == "missing-file":
        _rewrite(built["path"], bad, lambda n, d: None if n.endswith(".cubin") else d)
    elif how == "truncated":
        bad.write_bytes(built["path"].read_bytes()[:-200])
    else:
        bad.write_bytes(b"\x1f\x8b not a tar at all")
    got = probe("twice", tmp_path / "c", bad, H200.key(), tmp_path / "root")
    assert got["refused"] is not None
    assert "corrupt" in got["refused"] or "not a vsr kernel bundle" in got["refused"]
    assert not (tmp_path / "root").exists() or not any(p.name[0] != "." for p in (tmp_path / "root").iterdir())
    assert groups_written(tmp_path / "c") == ["__grp__twice_kernel.json"]
    assert got["cubins"]["twice"] == built["cubins"]["twice"]


def test_find_and_activate_picks_this_device_and_says_why_others_are_not_used(built, tmp_path, monkeypatch):
    monkeypatch.delenv(bundle.BUNDLE_ENV, raising=False)
    cache = built["path"].parent / "nvidia-h200.json"     # (the cache file itself need not exist)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")   # another device's bundle beside the cache: silent
            assert bundle.find_and_activate(OTHER, cache, tmp_path / "root") is None
        m = bundle.find_and_activate(H200, cache, tmp_path / "root")
        assert m is not None and bundle.active_path() == str(built["path"])
        bundle.deactivate()
        with pytest.warns(UserWarning, match="other Triton version"):
            assert bundle.find_and_activate(H200, cache, tmp_path / "root", triton_version="0.1") is None
        monkeypatch.setenv(bundle.BUNDLE_ENV, "off")
        assert bundle.find_and_activate(H200, cache, tmp_path / "root") is None
    finally:
        bundle.deactivate()


def test_vsr_tune_imports_and_exports_a_bundle(built, tmp_path, monkeypatch):
    from vsr.cli.tune import main

    monkeypatch.setenv("VSR_CACHE_DIR", str(tmp_path / "vsr"))
    r = CliRunner().invoke(main, ["import", str(built["path"]), "--json"])
    assert r.exit_code == 0, r.output
    installed = tmp_path / "vsr" / "bundles" / "installed" / built["path"].name
    assert installed.read_bytes() == built["path"].read_bytes()
    r = CliRunner().invoke(main, ["export", "--bundle", str(installed), "--out", str(tmp_path / "out.bundle.tar.gz")])
    assert r.exit_code == 0, r.output
    assert (tmp_path / "out.bundle.tar.gz").read_bytes() == built["path"].read_bytes()
    bad = tmp_path / "bad.bundle.tar.gz"
    _rewrite(built["path"], bad, _flip_cubin)
    r = CliRunner().invoke(main, ["import", str(bad)])
    assert r.exit_code == 2 and "does not match its checksum" in r.output
    assert not (tmp_path / "vsr" / "bundles" / "installed" / bad.name).exists()
