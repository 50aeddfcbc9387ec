"""Packages: manifest identity, resolution, and the device check coming before any weight is read."""
import builtins
import io
import json
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from vsr.autotune.device_id import DeviceIdentity
from vsr.runtime import device as dev
from vsr.runtime import package as pkg
from vsr.runtime.errors import DeviceRefusal, PackageError

CPU = DeviceIdentity("cpu", "x86_64", None, None, 2)
H200 = DeviceIdentity("nvidia", "NVIDIA H200", (9, 0), None, 132)
ALL_SOFTWARE = dev.Probes(True, True, True)

FP8_GROUP = {
    "format": "float-quantized", "targets": ["Linear"], "output_activations": None,
    "weights": {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "channel", "dynamic": False},
    "input_activations": {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "token",
                          "dynamic": True},
}
INT4_GROUP = {
    "format": "pack-quantized", "targets": ["Linear"], "output_activations": None, "input_activations": None,
    "weights": {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group", "group_size": 128,
                "dynamic": False, "actorder": "static"},
}
NVFP4_GROUP = {
    "format": "nvfp4-pack-quantized", "targets": ["Linear"], "output_activations": None,
    "weights": {"num_bits": 4, "type": "float", "symmetric": True, "strategy": "tensor_group",
                "group_size": 16, "dynamic": False, "scale_dtype": "torch.float8_e4m3fn"},
    "input_activations": {"num_bits": 4, "type": "float", "symmetric": True, "strategy": "tensor_group",
                          "group_size": 16, "dynamic": "local", "scale_dtype": "torch.float8_e4m3fn"},
}
GROUPS = {"fp8": FP8_GROUP, "int4": INT4_GROUP, "nvfp4": NVFP4_GROUP}


def make_package(root: Path, fmt: str = "dense", dtype: str = "float32", manifest: bool = True,
                 name: str = "test/tiny", revision: str = "r1") -> Path:
    """A hand-made package: config.json (+ quantization_config), a tiny safetensors, a tokenizer file."""
    root.mkdir(parents=True, exist_ok=True)
    config = {"architectures": ["BertModel"], "model_type": "bert", "hidden_size": 8, "dtype": dtype}
    if fmt != "dense":
        config["quantization_config"] = {
            "quant_method": "compressed-tensors", "format": GROUPS[fmt]["format"],
            "quantization_status": "compressed", "config_groups": {"group_0": GROUPS[fmt]},
            "ignore": ["classifier"],
        }
    (root / "config.json").write_text(json.dumps(config, indent=2))
    g = torch.Generator().manual_seed(0)
    save_file({"encoder.layer.0.dense.weight": torch.randn(8, 8, generator=g)}, str(root / "model.safetensors"))
    (root / "tokenizer.json").write_text('{"version": "1.0"}')
    if manifest:
        pkg.write_manifest(root, name, fmt, revision=revision)
    return root


def test_manifest_lists_every_file_with_size_and_sha256(tmp_path):
    root = make_package(tmp_path / "p")
    (root / "sub").mkdir()
    (root / "sub" / "extra.txt").write_text("x")
    pkg.write_manifest(root, "test/tiny", "dense", revision="r2")
    m = json.loads((root / "MODEL_MANIFEST.json").read_text())
    assert (m["name"], m["revision"], m["format"]) == ("test/tiny", "r2", "dense")
    assert set(m["files"]) == {"config.json", "model.safetensors", "tokenizer.json", "sub/extra.txt"}
    import hashlib
    data = (root / "model.safetensors").read_bytes()
    assert m["files"]["model.safetensors"] == {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def test_opens_a_verified_package(tmp_path):
    root = make_package(tmp_path / "p", "int4", "bfloat16")
    opened = pkg.open_package(root, device=CPU, revision="r1")
    assert opened.identity_status == "verified"
    assert (opened.name, opened.revision) == ("test/tiny", "r1")
    assert opened.formats >= {"int4"} and opened.model_dtype == torch.bfloat16
    assert opened.support == "not measured"
    assert opened.path == root and opened.config["model_type"] == "bert"


def test_torch_dtype_key_and_default(tmp_path):
    root = make_package(tmp_path / "p", manifest=False)
    cfg = json.loads((root / "config.json").read_text())
    del cfg["dtype"]
    cfg["torch_dtype"] = "float16"
    (root / "config.json").write_text(json.dumps(cfg))
    assert pkg.open_package(root, device=CPU, allow_unverified=True).model_dtype == torch.float16
    del cfg["torch_dtype"]
    (root / "config.json").write_text(json.dumps(cfg))
    assert pkg.open_package(root, device=CPU, allow_unverified=True).model_dtype == torch.float32


@pytest.mark.parametrize("change,named", [
    ("missing", "tokenizer.json"),
    ("extra", "notes.txt"),
    ("size", "model.safetensors"),
    ("bytes", "model.safetensors"),
])
def test_identity_failures_name_the_file(tmp_path, change, named):
    root = make_package(tmp_path / "p")
    if change == "missing":
        (root / "tokenizer.json").unlink()
    elif change == "extra":
        (root / "notes.txt").write_text("added later")
    elif change == "size":
        with open(root / "model.safetensors", "ab") as f:
            f.write(b"\0")
    else:  # same size, one byte flipped in the middle of the tensor data
        data = bytearray((root / "model.safetensors").read_bytes())
        data[-5] ^= 0x01
        (root / "model.safetensors").write_bytes(bytes(data))
    with pytest.raises(PackageError) as e:
        pkg.open_package(root, device=CPU)
    assert named in str(e.value)
    if change == "bytes":
        assert "sha256" in str(e.value)


def test_changed_config_is_caught(tmp_path):
    root = make_package(tmp_path / "p")
    text = (root / "config.json").read_text().replace('"hidden_size": 8', '"hidden_size": 9')
    (root / "config.json").write_text(text)
    with pytest.raises(PackageError, match="config.json"):
        pkg.open_package(root, device=CPU)


def test_revision_must_match_the_manifest(tmp_path):
    root = make_package(tmp_path / "p", revision="2fb271adbd")
    assert pkg.open_package(root, device=CPU, revision="2fb271adbd").revision == "2fb271adbd"
    with pytest.raises(PackageError) as e:
        pkg.open_package(root, device=CPU, revision="93aa927c5b")
    assert "93aa927c5b" in str(e.value) and "2fb271adbd" in str(e.value)


def test_no_manifest_needs_allow_unverified(tmp_path):
    root = make_package(tmp_path / "p", manifest=False)
    with pytest.raises(PackageError, match="MODEL_MANIFEST.json.*--allow-unverified"):
        pkg.open_package(root, device=CPU)
    opened = pkg.open_package(root, device=CPU, allow_unverified=True)
    assert opened.identity_status == "unverified" and opened.revision is None
    with pytest.raises(PackageError, match="revision r9"):
        pkg.open_package(root, device=CPU, allow_unverified=True, revision="r9")


def test_malformed_manifest_and_config_are_named(tmp_path):
    root = make_package(tmp_path / "p")
    (root / "MODEL_MANIFEST.json").write_text("{broken")
    with pytest.raises(PackageError, match="MODEL_MANIFEST.json"):
        pkg.open_package(root, device=CPU)
    root2 = make_package(tmp_path / "q", manifest=False)
    (root2 / "config.json").write_text('{"model_type": "bert",\n  oops}')
    with pytest.raises(PackageError, match=r"config.json: broken JSON at line 2"):
        pkg.open_package(root2, device=CPU, allow_unverified=True)


def test_unknown_package_names_it_and_suggests_list(tmp_path):
    with pytest.raises(PackageError) as e:
        pkg.open_package("nobody/no-such-model", device=CPU)
    assert "nobody/no-such-model" in str(e.value) and "--list" in str(e.value)
    with pytest.raises(PackageError, match="no config.json"):
        pkg.open_package(tmp_path, device=CPU)


def test_unknown_scheme_is_refused_by_name(tmp_path):
    root = make_package(tmp_path / "p", "fp8", manifest=False)
    cfg = json.loads((root / "config.json").read_text())
    cfg["quantization_config"]["format"] = "marlin-24"
    cfg["quantization_config"]["config_groups"]["group_0"]["format"] = "marlin-24"
    (root / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(PackageError, match="marlin-24"):
        pkg.open_package(root, device=CPU, allow_unverified=True)


@pytest.mark.parametrize("fmt,ident,match", [
    ("fp8", CPU, "FP8 weights need an NVIDIA GPU of compute capability 8.9"),
    ("nvfp4", H200, "FP4 tensor cores"),
])
def test_refusal_comes_before_any_weight_is_read(tmp_path, monkeypatch, fmt, ident, match):
    root = make_package(tmp_path / "p", fmt, "bfloat16")
    # The weights file becomes a FIFO: any open() for reading would block, any hash would fail.
    weights = root / "model.safetensors"
    weights.unlink()
    os.mkfifo(weights)
    # And any open of a weight (or manifest) file through Python fails loudly.
    real_open = builtins.open
    opened = []

    def guarded_open(file, *a, **k):
        opened.append(str(file))
        if str(file).endswith((".safetensors", "MODEL_MANIFEST.json")):
            raise AssertionError(f"read {file} before the device check")
        return real_open(file, *a, **k)

    monkeypatch.setattr(builtins, "open", guarded_open)
    monkeypatch.setattr(io, "open", guarded_open)
    with pytest.raises(DeviceRefusal, match=match):
        pkg.open_package(root, device=ident, probes=ALL_SOFTWARE)
    assert not any(p.endswith(".safetensors") for p in opened)
    # The same package with the explicit emulation passes the device check and reaches the
    # identity check, which names the FIFO (it is not the file the manifest lists).
    monkeypatch.setattr(builtins, "open", real_open)
    monkeypatch.setattr(io, "open", real_open)
    with pytest.raises(PackageError, match="model.safetensors"):
        pkg.open_package(root, device=ident, emulate=True, probes=ALL_SOFTWARE)


def test_emulated_package_opens_labelled(tmp_path):
    root = make_package(tmp_path / "p", "fp8")
    opened = pkg.open_package(root, device=CPU, emulate=True)
    assert opened.support == "emulated" and opened.identity_status == "verified"
    assert pkg.open_package(make_package(tmp_path / "q", "fp8"), device=H200).support == "yes"


def test_builtin_names_resolve_through_builtin(tmp_path, monkeypatch):
    """A built-in name goes through vsr.runtime.builtin.resolve; a refused sibling is not built."""
    import sys
    import types
    built = []
    root = make_package(tmp_path / "b", name="vsr/intent-minilm", revision="abc")

    def resolve(name):
        if name not in fake.BUILTINS:
            return None
        built.append(name)
        return root

    fake = types.ModuleType("vsr.runtime.builtin")
    fake.BUILTINS = ("vsr/intent-minilm", "vsr/intent-minilm-FP8")
    fake.resolve = resolve
    monkeypatch.setitem(sys.modules, "vsr.runtime.builtin", fake)
    import vsr.runtime
    monkeypatch.setattr(vsr.runtime, "builtin", fake, raising=False)

    opened = pkg.open_package("vsr/intent-minilm", device=CPU)
    assert opened.name == "vsr/intent-minilm" and opened.builtin and opened.identity_status == "verified"
    with pytest.raises(DeviceRefusal, match="FP8 weights need"):
        pkg.open_package("vsr/intent-minilm-FP8", device=CPU)
    assert built == ["vsr/intent-minilm"]   # the refused FP8 sibling was never built
    with pytest.raises(PackageError, match="did you mean vsr/intent-minilm-FP8"):
        pkg.open_package("vsr/intent-minilm-fp8", device=CPU)


def test_remembered_hashes_still_catch_a_change(tmp_path, monkeypatch):
    """Large files' hashes are remembered by stat fields; a same-size change is still caught."""
    import time
    monkeypatch.setenv("VSR_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(pkg, "HASH_CACHE_MIN_BYTES", 0)
    monkeypatch.setattr(pkg, "HASH_CACHE_SETTLE_NS", 0)
    root = make_package(tmp_path / "p")
    pkg.open_package(root, device=CPU)
    remembered = json.loads((tmp_path / "cache" / pkg._HASH_CACHE).read_text())
    assert len(remembered) == 3   # config.json, model.safetensors, tokenizer.json

    hashed = []
    real = pkg.sha256_file
    monkeypatch.setattr(pkg, "sha256_file", lambda p: hashed.append(Path(p).name) or real(p))
    pkg.open_package(root, device=CPU)
    assert hashed == []   # every hash came from the cache

    time.sleep(0.05)      # past the filesystem's timestamp tick
    with open(root / "model.safetensors", "r+b") as f:
        f.seek(-5, os.SEEK_END)
        b = f.read(1)
        f.seek(-5, os.SEEK_END)
        f.write(bytes([b[0] ^ 1]))
    with pytest.raises(PackageError, match="model.safetensors changed: its sha256"):
        pkg.open_package(root, device=CPU)
    assert hashed == ["model.safetensors"]


def test_recent_files_are_not_remembered(tmp_path, monkeypatch):
    monkeypatch.setenv("VSR_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(pkg, "HASH_CACHE_MIN_BYTES", 0)
    root = make_package(tmp_path / "p")
    pkg.open_package(root, device=CPU)   # files written just now: inside the settle window
    assert not (tmp_path / "cache" / pkg._HASH_CACHE).exists()


def test_an_unreadable_config_is_a_package_error(tmp_path, monkeypatch):
    (tmp_path / "config.json").write_text("{}")
    real = Path.read_text

    def deny(self, *a, **k):
        if self.name == "config.json":
            raise PermissionError(13, "Permission denied", str(self))
        return real(self, *a, **k)

    monkeypatch.setattr(Path, "read_text", deny)
    with pytest.raises(PackageError, match="config.json: cannot be read"):
        pkg.read_config(tmp_path)
