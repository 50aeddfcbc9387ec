"""vsr-run through click's CliRunner: --check-device, refusals, identity, bad requests, dispatch."""
import json
import os
import sys
import types

import pytest
from click.testing import CliRunner

import vsr.runtime
from test_package import make_package
from vsr.autotune.device_id import DeviceIdentity
from vsr.cli.run import main
from vsr.runtime import device as dev
from vsr.runtime import package as pkg

H200 = DeviceIdentity("nvidia", "NVIDIA H200", (9, 0), None, 132)
A100 = DeviceIdentity("nvidia", "NVIDIA A100-SXM4-80GB", (8, 0), None, 108)
CPU_FP8 = dev.FP8_REFUSAL


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    """Remembered hashes (and anything else vsr caches) go to a per-test folder, not ~/.cache/vsr."""
    monkeypatch.setenv("VSR_CACHE_DIR", str(tmp_path / "vsr-cache"))


def invoke(*args, input=None):
    return CliRunner().invoke(main, list(args), input=input, catch_exceptions=False)


def simulate(monkeypatch, identity):
    """Every device lookup of vsr-run (check-device, open_package) sees `identity`."""
    monkeypatch.setattr(pkg, "device_identity", lambda device=None: identity)


def json_lines(text):
    return [json.loads(line) for line in text.splitlines() if line.strip()]


# ---- --check-device ---------------------------------------------------------------------

def test_check_device_on_this_cpu():
    r = invoke("--check-device", "--device", "cpu")   # (the default is a GPU where there is one)
    assert r.exit_code == 0, r.output
    assert "table row: CPU" in r.stdout
    assert "int4 (W4A16)" in r.stdout and "not measured" in r.stdout
    assert CPU_FP8 in r.stdout and "FP4 tensor cores" in r.stdout


def test_cuda_graphs_need_a_cuda_device_before_any_request_is_read():
    r = CliRunner().invoke(main, ["--cuda-graphs", "--device", "cpu", "--input", "-"], input="not json\n")
    assert r.exit_code == 2 and "--cuda-graphs needs a CUDA device (the device is cpu)" in r.output


def test_check_device_json_and_subcommand_agree():
    a = json.loads(invoke("--check-device", "--json", "--device", "cpu").stdout)
    b = json.loads(invoke("check-device", "--json", "--device", "cpu").stdout)
    assert a["formats"] == b["formats"]
    assert a["device"]["vendor"] == "cpu"
    assert a["formats"]["fp8"]["status"] == "refused" and a["formats"]["fp8"]["reason"].startswith(CPU_FP8)
    assert a["formats"]["int4"]["status"] == "not measured"
    assert a["formats"]["dense"]["status"] == "runs"


def test_check_device_simulated_hopper(monkeypatch):
    simulate(monkeypatch, H200)
    out = json.loads(invoke("--check-device", "--json").stdout)
    assert out["device"]["compute_capability"] == "9.0"
    assert {k: v["status"] for k, v in out["formats"].items()} == {
        "dense": "runs", "bf16": "runs", "fp8": "runs", "int4": "runs", "nvfp4": "refused"}
    human = invoke("--check-device").stdout
    assert "compute capability 9.0" in human and "with the fused kernel" in human


# ---- refusals and package errors ---------------------------------------------------------

def test_fp8_package_refused_on_cpu_before_weights(tmp_path):
    root = make_package(tmp_path / "p", "fp8", "bfloat16")
    (root / "model.safetensors").unlink()
    os.mkfifo(root / "model.safetensors")   # reading it would block: the refusal must come first
    r = invoke(str(root), "--text", "turn on the lights", "--device", "cpu")
    assert r.exit_code == 3
    assert CPU_FP8 in r.stderr and "--emulate" in r.stderr
    assert r.stdout == ""


def test_nvfp4_refused_on_simulated_ampere(monkeypatch, tmp_path):
    simulate(monkeypatch, A100)
    root = make_package(tmp_path / "p", "nvfp4", "bfloat16")
    r = invoke(str(root), "--text", "hi")
    assert r.exit_code == 3
    assert dev.MISSING_FP4_CORES in r.stderr and "A100" in r.stderr


def test_unknown_package_names_it_and_suggests_list():
    r = invoke("someone/unknown-router", "--text", "hi")
    assert r.exit_code == 4
    assert "someone/unknown-router" in r.stderr and "--list" in r.stderr


def test_identity_errors_exit_4_naming_file_and_revision(tmp_path):
    root = make_package(tmp_path / "p", revision="2fb271a")
    r = invoke(str(root), "--text", "hi", "--revision", "39ffacd")
    assert r.exit_code == 4 and "39ffacd" in r.stderr and "2fb271a" in r.stderr
    (root / "tokenizer.json").write_text('{"version": "1.1"}')
    r = invoke(str(root), "--text", "hi")
    assert r.exit_code == 4 and "tokenizer.json" in r.stderr
    (root / "MODEL_MANIFEST.json").unlink()
    r = invoke(str(root), "--text", "hi")
    assert r.exit_code == 4 and "--allow-unverified" in r.stderr


def test_needs_some_request():
    r = invoke()
    assert r.exit_code == 2 and "--text" in r.output


# ---- built-ins, self-check and eval, with fakes for the built-in slice ----------------------

@pytest.fixture
def fake_builtin(monkeypatch, tmp_path):
    mod = types.ModuleType("vsr.runtime.builtin")
    mod.BUILTINS = ("vsr/intent-minilm", "vsr/intent-minilm-FP8")
    mod.resolve = lambda name: None
    mod.calls = []

    def self_check(engine, name, revision=None):
        mod.calls.append(name)
        return {"status": "mismatch", "package": name, "requests": 3,
                "differ": [{"index": 1, "expected": "a", "got": "b"}]}

    mod.self_check = self_check
    monkeypatch.setitem(sys.modules, "vsr.runtime.builtin", mod)
    monkeypatch.setattr(vsr.runtime, "builtin", mod, raising=False)
    return mod


def test_list_shows_builtins(fake_builtin):
    r = invoke("--list")
    assert r.exit_code == 0
    assert r.stdout.splitlines() == ["vsr/intent-minilm  (default)", "vsr/intent-minilm-FP8"]
    assert json.loads(invoke("--list", "--json").stdout)["builtin_packages"] == list(fake_builtin.BUILTINS)


def test_eval_dispatches_to_evaluate(monkeypatch):
    calls = {}
    mod = types.ModuleType("vsr.runtime.evaluate")

    def evaluate(names, against, **kw):
        calls.update(names=names, against=against, **kw)
        return {"rows": [{"package": n} for n in names]}

    mod.evaluate = evaluate
    mod.format_table = lambda rec: "TABLE " + " ".join(r["package"] for r in rec["rows"])
    monkeypatch.setitem(sys.modules, "vsr.runtime.evaluate", mod)
    monkeypatch.setattr(vsr.runtime, "evaluate", mod, raising=False)
    r = invoke("eval", "a/x", "b/y", "--against", "c/z", "--emulate", "--limit", "50")
    assert r.exit_code == 0, r.output
    assert calls["names"] == ["a/x", "b/y"] and calls["against"] == "c/z"
    assert calls["emulate"] is True and calls["limit"] == 50
    assert r.stdout.strip() == "TABLE a/x b/y"


# ---- the inference path (C's engine on the real MiniLM encoder with a random head) -----------

@pytest.fixture(scope="module")
def router(tmp_path_factory):
    from tinypkgs import build_minilm_router
    root = build_minilm_router(tmp_path_factory.mktemp("cli") / "router")
    pkg.write_manifest(root, "test/router", "dense", revision="r1")
    return root


def test_answers_and_per_request_errors(router, tmp_path):
    from tinypkgs import ROUTER_LABELS
    long_text = " ".join(["lights"] * 2000)
    req = tmp_path / "requests.jsonl"
    req.write_text('{"text": "what is the temperature in the kitchen", "id": "a"}\n'
                   '{"text": "broken\n'
                   '\n'
                   f'{{"text": "{long_text}"}}\n'
                   '{"text": "pause the music"}\n')
    r = invoke(str(router), "--text", "turn on the kitchen lights", "--text", "  ", "--input", str(req),
               "--json", "--device", "cpu", "--top-k", "4")
    assert r.exit_code == 1, r.output
    out = json_lines(r.stdout)
    assert [o["request"] for o in out] == [1, 2, 3, 4, 5, 6]
    ok = [o for o in out if "error" not in o]
    assert [o["request"] for o in ok] == [1, 3, 6]
    assert ok[1]["id"] == "a" and ok[1]["line"] == 1
    for o in ok:
        assert o["mode"] == "reference" and o["kernel_set"] == "exact" and o["choice"] == o["top"][0][0]
        probs = [p for _, p in o["top"]]
        assert len(probs) == 4 and probs == sorted(probs, reverse=True) and 0 < sum(probs) <= 1 + 1e-6
        assert {label for label, _ in o["top"]} <= set(ROUTER_LABELS)
    errs = {o["request"]: o["error"] for o in out if "error" in o}
    assert errs[2] == "empty text"
    assert "broken JSON" in errs[4] and out[3]["line"] == 2
    assert errs[5]   # over-long: the engine's message
    assert "request 2 (--text 2): empty text" in r.stderr
    assert "request 4 (" in r.stderr and "line 2): broken JSON" in r.stderr
    assert "request 5 (" in r.stderr and "line 4)" in r.stderr

    # The same answers as the engine gives directly, and as the human output shows.
    from vsr.runtime.engine import load_engine
    engine = load_engine(pkg.open_package(router, device="cpu"), device="cpu")
    direct = engine.predict(["turn on the kitchen lights", "what is the temperature in the kitchen",
                             "pause the music"], top_k=4)
    assert [o["top"] for o in ok] == [d["top"] for d in direct]
    human = invoke(str(router), "--text", "turn on the kitchen lights", "--device", "cpu")
    assert human.exit_code == 0
    assert human.stdout.startswith(f"[1] {direct[0]['choice']}  ({direct[0]['top'][0][0]} ")


def test_emulated_outputs_are_labelled(router):
    r = invoke(str(router), "--text", "open the garage door", "--text", "lock the front door", "--json",
               "--emulate", "--device", "cpu")
    assert r.exit_code == 0, r.output
    assert [o["mode"] for o in json_lines(r.stdout)] == ["emulated", "emulated"]
    human = invoke(str(router), "--text", "open the garage door", "--emulate", "--device", "cpu")
    assert all(line.endswith("[emulated]") for line in human.stdout.splitlines())


def test_self_check_mismatch_exits_5(router, fake_builtin):
    r = invoke(str(router), "--self-check", "--device", "cpu")
    assert r.exit_code == 5, r.output
    assert fake_builtin.calls == ["test/router"]
    assert "self-check: mismatch" in r.stdout and '"expected": "a"' in r.stdout


@pytest.mark.slow
def test_llm_compressor_fp8_package_end_to_end(router):
    """A package as llm-compressor writes it (no manifest): refused on the CPU, then run emulated."""
    from tinypkgs import compressed
    fp8 = compressed(router, "FP8_DYNAMIC")
    r = invoke(str(fp8), "--text", "turn on the lights", "--device", "cpu")
    assert r.exit_code == 3 and CPU_FP8 in r.stderr          # refused before the identity question
    r = invoke(str(fp8), "--text", "turn on the lights", "--device", "cpu", "--emulate")
    assert r.exit_code == 4 and "--allow-unverified" in r.stderr
    r = invoke(str(fp8), "--text", "turn on the lights", "--text", "", "--device", "cpu", "--emulate",
               "--allow-unverified", "--json")
    assert r.exit_code == 1
    out = json_lines(r.stdout)
    assert out[0]["mode"] == "emulated" and out[0]["choice"] == out[0]["top"][0][0]
    assert out[1] == {"request": 2, "error": "empty text"}
    assert "identity unverified" in r.stderr and "mode emulated; kernels exact" in r.stderr


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="needs a machine without CUDA")
def test_unavailable_device_is_named():
    r = invoke("--check-device", "--device", "cuda:0")
    assert r.exit_code == 3 and "'cuda:0' is not available here" in r.stderr
    r = invoke("--text", "hi", "--device", "tpu-ish")
    assert r.exit_code == 3 and "'tpu-ish'" in r.stderr


def test_more_requests_than_one_batch_stay_in_order(router, tmp_path):
    from vsr.cli.run import BATCH
    n = BATCH + 6
    lines = [json.dumps({"text": f"turn on light number {i}", "id": i}) if i % 17 else "{oops"
             for i in range(n)]
    (tmp_path / "r.jsonl").write_text("\n".join(lines) + "\n")
    r = invoke(str(router), "--input", str(tmp_path / "r.jsonl"), "--json", "--device", "cpu", "--top-k", "1")
    assert r.exit_code == 1
    out = json_lines(r.stdout)
    assert [o["request"] for o in out] == list(range(1, n + 1))
    assert [o["line"] for o in out] == list(range(1, n + 1))
    assert all(("error" in o) == (i % 17 == 0) for i, o in enumerate(out))
    assert all(o["id"] == i for i, o in enumerate(out) if i % 17)


def test_non_utf8_line_is_named_and_stdin_works(router):
    data = '{"text": "open the blinds"}\n'.encode() + b'{"text": "caf\xe9"}\n' + b'{"text": "close the blinds"}\n'
    r = invoke(str(router), "--input", "-", "--json", "--device", "cpu", input=data)
    assert r.exit_code == 1
    out = json_lines(r.stdout)
    assert ["error" in o for o in out] == [False, True, False]
    assert "not UTF-8" in out[1]["error"] and "request 2 (stdin line 2)" in r.stderr


def test_a_byte_order_mark_does_not_break_the_first_line(router):
    data = b"\xef\xbb\xbf" + '{"text": "open the blinds"}\n{"text": "close the blinds"}\n'.encode()
    r = invoke(str(router), "--input", "-", "--json", "--device", "cpu", input=data)
    assert r.exit_code == 0, r.stderr
    out = json_lines(r.stdout)
    assert [("choice" in o) for o in out] == [True, True]
