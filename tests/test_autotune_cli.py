"""vsr-tune on CPU (the Triton interpreter, fp16/fp32 so tl.dot is exact): tune a shape spec and a
package, ls/show/export/import/merge/verify/coverage, resumability, --json everywhere."""
import functools
import json

import pytest
import torch
from click.testing import CliRunner

from vsr.cli.tune import main

SHAPES = ["40x64,24x32", "--formats", "fp16,fp32", "--buckets", "1,4"]


def run(*args, ok=True):
    res = CliRunner().invoke(main, [str(a) for a in args])
    if ok is not None:
        assert (res.exit_code == 0) == ok, f"exit {res.exit_code}: {res.output}\n{res.exception!r}"
    return res


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    d = tmp_path_factory.mktemp("tune")
    res = run(*SHAPES, "--autotune-cache", d / "c.db", "--json")
    return d, json.loads(res.stdout)


def test_tune_records_every_key_and_resumes(tuned):
    d, rep = tuned
    assert rep["keys"] == 8 and len(rep["tuned"]) == 8 and not rep["failed"] and rep["timing_calls"] > 0
    again = json.loads(run(*SHAPES, "--autotune-cache", d / "c.db", "--json").stdout)
    assert again["tuned"] == [] and again["recorded_before"] == 8 and again["timing_calls"] == 0


def test_ls_json_has_the_issue_fields(tuned):
    d, _ = tuned
    rows = json.loads(run("ls", "--autotune-cache", d / "c.db", "--json").stdout)
    assert len(rows) == 8
    for r in rows:
        assert {"device", "format", "N", "K", "bucket", "tile"} <= set(r)
        assert r["format"] in ("fp16", "fp32") and r["bucket"] in (1, 4) and (r["N"], r["K"]) in ((40, 64), (24, 32))
        assert r["tile"]["BLOCK_K"] > 0
    shown = json.loads(run("show", rows[0]["digest"][:10], "--autotune-cache", d / "c.db", "--json").stdout)
    assert shown["tile"] == rows[0]["tile"] and shown["candidates"][0]["ok"]
    assert run("show", "ffffffffff", "--autotune-cache", d / "c.db", ok=False).exit_code == 2


def test_export_import_and_merge_conflicts(tuned, tmp_path):
    d, _ = tuned
    run("export", "--autotune-cache", d / "c.db", "--out", tmp_path / "a.json")
    run("import", tmp_path / "a.json", "--autotune-cache", tmp_path / "b.db")
    run("export", "--autotune-cache", tmp_path / "b.db", "--out", tmp_path / "b.json")
    assert (tmp_path / "a.json").read_bytes() == (tmp_path / "b.json").read_bytes()
    doc = json.loads((tmp_path / "a.json").read_text())
    doc["entries"][0]["tile"]["BLOCK_N"] = 32 if doc["entries"][0]["tile"]["BLOCK_N"] != 32 else 64
    (tmp_path / "c.json").write_text(json.dumps(doc))
    res = run("merge", tmp_path / "c.json", "--autotune-cache", tmp_path / "b.db", "--json", ok=False)
    rep = json.loads(res.stdout)
    assert res.exit_code == 1 and len(rep["conflicts"]) == 1 and rep["identical"] == 7 and rep["conflicts"][0]["kept"] == "existing"
    rep = json.loads(run("merge", tmp_path / "c.json", "--autotune-cache", tmp_path / "b.db", "--prefer-incoming",
                         "--json").stdout)
    assert rep["replaced"] == 1


def test_verify_passes_and_catches_a_bad_tile(tuned, tmp_path):
    d, _ = tuned
    rep = json.loads(run("verify", "--autotune-cache", d / "c.db", "--json").stdout)
    assert rep["checked"] == 8 and rep["failed"] == 0
    run("export", "--autotune-cache", d / "c.db", "--out", tmp_path / "a.json")
    doc = json.loads((tmp_path / "a.json").read_text())
    doc["entries"][0]["tile"]["BLOCK_K"] = 3  # not a power of two: cannot compile
    doc["entries"][1]["key"]["source_hash"] = "0" * 16
    for e in doc["entries"][:2]:
        e.pop("digest")
    (tmp_path / "bad.json").write_text(json.dumps(doc))
    res = run("verify", "--autotune-cache", tmp_path / "bad.json", "--json", ok=False)
    rep = json.loads(res.stdout)
    assert rep["failed"] == 2
    errors = " ".join(r["error"] for r in rep["entries"] if not r["ok"])
    assert "stale" in errors and "failed" in errors


@pytest.mark.parametrize("form", ["json", "db"])
def test_prune_removes_only_stale_entries(tuned, tmp_path, form):
    d, _ = tuned
    run("export", "--autotune-cache", d / "c.db", "--out", tmp_path / "a.json")
    doc = json.loads((tmp_path / "a.json").read_text())
    doc["entries"][1]["key"]["source_hash"] = "0" * 16           # tuned against other kernel code
    doc["entries"][2]["key"]["template"] = "gone"                # a template this vsr lacks
    for e in doc["entries"][1:3]:
        e.pop("digest")
    (tmp_path / "s.json").write_text(json.dumps(doc))
    target = tmp_path / f"p.{form}"
    run("import", tmp_path / "s.json", "--autotune-cache", target)
    dry = json.loads(run("prune", "--dry-run", "--autotune-cache", target, "--json").stdout)
    assert dry["stale"] == 2 and dry["removed"] == 0
    assert len(json.loads(run("ls", "--autotune-cache", target, "--json").stdout)) == 8
    rep = json.loads(run("prune", "--autotune-cache", target, "--json").stdout)
    assert rep["removed"] == 2 and {e["why"][:5] for e in rep["entries"]} == {"stale", "no te"}
    left = json.loads(run("ls", "--autotune-cache", target, "--json").stdout)
    assert len(left) == 6
    assert json.loads(run("verify", "--autotune-cache", target, "--json").stdout)["failed"] == 0
    # Tuning afterwards records just the two pruned keys again.
    again = json.loads(run(*SHAPES, "--autotune-cache", target, "--json").stdout)
    assert len(again["tuned"]) == 2 and again["recorded_before"] == 6


def test_coverage_of_shapes(tuned):
    d, _ = tuned
    rep = json.loads(run("coverage", "40x64,8x16", "--formats", "fp16", "--buckets", "1,4,16",
                         "--autotune-cache", d / "c.db", "--json").stdout)
    assert rep["keys"] == 6 and rep["recorded"] == 2
    assert {(m["N"], m["bucket"]) for m in rep["missing"]} == {(40, 16), (8, 1), (8, 4), (8, 16)}


def test_bad_inputs_are_named(tmp_path):
    assert "not one of" in run("12x", "--autotune-cache", tmp_path / "x.db", ok=False).output
    assert "not a row bucket" in run("8x16", "--buckets", "3", "--autotune-cache", tmp_path / "x.db", ok=False).output
    (tmp_path / "junk.db").write_bytes(b"junk" * 100)
    out = run("8x16", "--formats", "fp32", "--autotune-cache", tmp_path / "junk.db", ok=False).output
    assert "junk.db" in out and "not an SQLite file" in out


def test_package_coverage_and_tune(tmp_path):
    from tinypkgs import build_tiny_qwen3
    pkg = build_tiny_qwen3(tmp_path / "q3")
    cache = tmp_path / "p.db"
    rep = json.loads(run("coverage", pkg, "--buckets", "1", "--act-dtype", "float16", "--autotune-cache", cache,
                         "--json").stdout)
    # the decoder's four products: q|k|v 256x128 (128 + 64 + 64), o 128x128, gate|up 512x128, down 128x256
    assert rep["recorded"] == 0 and {(m["N"], m["K"]) for m in rep["missing"]} == {
        (256, 128), (128, 128), (512, 128), (128, 256)}
    tr = json.loads(run(pkg, "--buckets", "1", "--act-dtype", "float16", "--max-candidates", "1",
                        "--autotune-cache", cache, "--json").stdout)
    assert len(tr["tuned"]) == rep["keys"] == 4
    rep = json.loads(run("coverage", pkg, "--buckets", "1", "--act-dtype", "float16", "--autotune-cache", cache,
                         "--json").stdout)
    assert rep["recorded"] == 4 and rep["missing"] == []


def test_time_budget_skips_and_a_rerun_resumes(tmp_path):
    args = ["24x32", "--formats", "fp32", "--buckets", "1,2", "--max-candidates", "1", "--autotune-cache", tmp_path / "t.db", "--json"]
    rep = json.loads(run(*args, "--time-budget", "0").stdout)
    assert rep["tuned"] == [] and len(rep["skipped"]) == 2
    rep = json.loads(run(*args).stdout)
    assert len(rep["tuned"]) == 2 and rep["skipped"] == []
    res = run("24x32", "--max-candidates", "0", "--autotune-cache", tmp_path / "t.db", ok=False)
    assert res.exit_code == 2 and "--max-candidates" in res.output  # a usage error, not a silent 1


def test_verify_flags_entries_of_another_triton_and_unrebuildable_keys(tuned, tmp_path):
    d, _ = tuned
    run("export", "--autotune-cache", d / "c.db", "--out", tmp_path / "a.json")
    doc = json.loads((tmp_path / "a.json").read_text())
    doc["entries"][0]["key"]["triton"] = "0.0.1"  # the runtime never reads it under this Triton
    params = json.loads(doc["entries"][1]["key"]["params"])
    doc["entries"][1]["key"]["params"] = json.dumps({**params, "bogus": 1}, sort_keys=True, separators=(",", ":"))
    for e in doc["entries"][:2]:
        e.pop("digest")
    (tmp_path / "bad.json").write_text(json.dumps(doc))
    rep = json.loads(run("verify", "--autotune-cache", tmp_path / "bad.json", "--json", ok=False).stdout)
    assert rep["checked"] == 8 and rep["failed"] == 2
    errors = " ".join(r["error"] for r in rep["entries"] if not r["ok"])
    assert "Triton 0.0.1" in errors and "cannot rebuild" in errors


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU may have FP4 tensor cores")
def test_a_format_the_device_cannot_run_is_a_message_not_a_traceback(tmp_path):
    for cmd in ([], ["coverage"]):
        res = run(*cmd, "64x128", "--formats", "nvfp4", "--buckets", "1", "--autotune-cache", tmp_path / "x.db",
                  ok=False)
        assert res.exit_code == 2 and "FP4 tensor cores" in res.output and "nvfp4-emulated" in res.output
        assert isinstance(res.exception, SystemExit)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA")
def test_a_cuda_device_on_a_machine_without_one_is_a_usage_error(tmp_path):
    r = CliRunner().invoke(main, ["coverage", "27b", "--autotune-cache", str(tmp_path / "c.db"), "--device", "cuda"])
    assert r.exit_code == 2
    assert "no CUDA device" in r.output and "Traceback" not in r.output


def test_incumbents_join_a_retune_from_a_cache_of_older_kernels(tuned, tmp_path):
    # A cache tuned for other kernels (source hash and Triton changed) names a tile the one-tile
    # pick leaves out: with --incumbents it is timed beside the default, without it it is not.
    from vsr.kernels import registry
    from vsr.kernels.template import Problem
    d, _ = tuned
    space = registry.TEMPLATES["dense"].search_space(Problem(40, 64, 1, torch.float16, (("wdtype", "float16"),)))
    run("export", "--autotune-cache", d / "c.db", "--out", tmp_path / "a.json")
    doc = json.loads((tmp_path / "a.json").read_text())
    target = [e for e in doc["entries"] if (e["key"]["N"], e["key"]["K"], e["key"]["bucket"],
                                            e["key"]["act_dtype"]) == (40, 64, 1, "float16")]
    assert len(target) == 1 and len(space) > 2
    target[0]["key"].update(source_hash="0" * 16, triton="0.0.1")
    target[0]["tile"] = space[-1]
    for e in doc["entries"]:
        e.pop("digest")
    (tmp_path / "old.json").write_text(json.dumps(doc))
    one = ["40x64", "--formats", "fp16", "--buckets", "1", "--max-candidates", "1"]

    def tried(db, *extra):
        rep = json.loads(run(*one, "--autotune-cache", db, *extra, "--json").stdout)
        assert rep.get("keys_with_incumbents") == (1 if extra else None)
        (row,) = json.loads(run("ls", "--autotune-cache", db, "--json").stdout)
        shown = json.loads(run("show", row["digest"], "--autotune-cache", db, "--json").stdout)
        return [c["tile"] for c in shown["candidates"]]
    assert tried(tmp_path / "plain.db") == [space[0]]
    key = functools.partial(json.dumps, sort_keys=True)
    assert sorted(map(key, tried(tmp_path / "inc.db", "--incumbents", tmp_path / "old.json"))) == \
        sorted(map(key, [space[0], space[-1]]))
    assert run(*one, "--autotune-cache", tmp_path / "x.db", "--incumbents", tmp_path / "none.json",
               ok=False).exit_code == 2
    (tmp_path / "bad.json").write_text("{not json")
    res = run(*one, "--autotune-cache", tmp_path / "x.db", "--incumbents", tmp_path / "bad.json", ok=False)
    assert res.exit_code == 2 and "Traceback" not in res.output and not (tmp_path / "x.db").exists()
    res = run("40x64", "--formats", "fp16", "--buckets", "1", "--autotune-cache", tmp_path / "y.db",
              "--incumbents", tmp_path / "old.json")
    assert "--incumbents matters only with --max-candidates or --paths" in res.output


def test_paths_tune_only_the_tiles_of_those_paths(tmp_path):
    # --paths: the space's tiles of the named kernel paths (here gemv, not the default tma-swap),
    # all of them without --max-candidates; a key whose space has none fails, naming the paths.
    from vsr.kernels import registry
    from vsr.kernels.template import Problem
    space = registry.TEMPLATES["dense"].search_space(Problem(40, 64, 1, torch.float16, (("wdtype", "float16"),)))
    gemv = [t for t in space if t["path"] == "gemv"]
    assert space[0]["path"] != "gemv" and len(gemv) > 1
    one = ["40x64", "--formats", "fp16", "--buckets", "1"]
    run(*one, "--paths", "gemv", "--autotune-cache", tmp_path / "g.db")
    (row,) = json.loads(run("ls", "--autotune-cache", tmp_path / "g.db", "--json").stdout)
    shown = json.loads(run("show", row["digest"], "--autotune-cache", tmp_path / "g.db", "--json").stdout)
    key = functools.partial(json.dumps, sort_keys=True)
    assert sorted(key(c["tile"]) for c in shown["candidates"]) == sorted(map(key, gemv))
    res = run(*one, "--paths", "frag", "--autotune-cache", tmp_path / "f.db", ok=False)
    assert res.exit_code == 1 and "holds no tile of the paths frag" in res.output


def test_the_shipped_cache_rebuild_script_runs_valid_vsr_tune_commands(tmp_path):
    # caches/retune.sh (how caches/nvidia-h200.json is rebuilt): each stage's commands, in order,
    # every one of them accepted by vsr-tune's option parser (a renamed option fails here).
    import shlex
    import subprocess
    from pathlib import Path
    script = Path(__file__).resolve().parent.parent / "caches" / "retune.sh"
    db = str(tmp_path / "h200.db")

    shipped = tmp_path / "shipped.json"     # the file the rebuild replaces: its tiles are incumbents
    shipped.write_text("{}")

    def stage(name, **env):
        p = subprocess.run(["bash", str(script), name, db], capture_output=True, text=True,
                           env={"PATH": "/usr/bin:/bin", "VSR_TUNE": "echo", "OUT_JSON": str(shipped), **env},
                           timeout=60)
        assert p.returncode == 0, p.stderr
        return [shlex.split(line) for line in p.stdout.splitlines()]
    for cmd in stage("27b", INCUMBENTS="") + stage("minilm", OUT_JSON=str(tmp_path / "first-build.json")):
        assert "--incumbents" not in cmd
    typo = subprocess.run(["bash", str(script), "27b", db], capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin", "VSR_TUNE": "echo", "INCUMBENTS": str(tmp_path / "absent.json")})
    assert typo.returncode == 2 and "does not exist" in typo.stderr and not typo.stdout
    big, small = stage("27b"), stage("minilm")
    for cmd in [big[0], big[2], small[0], small[1]]:
        assert cmd[cmd.index("--incumbents") + 1] == str(shipped)
    assert [c[0] for c in big] == ["27b", "27b", "27b", "import"] and [c[0] for c in small] == ["minilm", "minilm", "export"]
    # MiniLM's dense fp32 keys (the built-in router's products) at 8 candidates, the rest at 4
    assert small[0][small[0].index("--formats") + 1] == "fp32" and small[0][small[0].index("--max-candidates") + 1] == "8"
    assert "fp32" not in small[1][small[1].index("--formats") + 1].split(",")
    assert small[1][small[1].index("--max-candidates") + 1] == "4"
    # the 16-candidate store imported under DB
    assert big[3][1] == big[0][2] and big[1][2] == big[2][2] == big[3][3] == db
    assert "--max-candidates" in big[2] and big[2][big[2].index("--max-candidates") + 1] == "20"
    # int4's buckets 2 and 4 over their whole spaces first (no pick, so no incumbents), then the
    # rest at 20; int4 is not tuned at 16 too (the import would only throw that away)
    assert big[1] == ["27b", "--autotune-cache", db, "--formats", "int4-gptq,int4-awq", "--buckets", "2,4"]
    assert big[2] == ["27b", "--autotune-cache", db, "--formats", "int4-gptq,int4-awq", "--max-candidates", "20",
                      "--incumbents", str(shipped)]
    assert big[0][big[0].index("--formats") + 1] == "bf16,fp8"
    # stale: after a kernel edit, one stage: import FROM_JSON (default the file rebuilt), prune, the
    # three 27b passes and the minilm one (only keys left without a tile get tuned), export
    stale = stage("stale", FROM_JSON=str(tmp_path / "from.json"))
    assert [c[0] for c in stale] == ["import", "prune", "27b", "27b", "27b", "minilm", "minilm", "export"]
    assert stale[0][1] == str(tmp_path / "from.json") and stage("stale")[0][1] == str(shipped)
    def opts(c):
        return c[0], c[c.index("--formats") + 1], c[c.index("--max-candidates") + 1], c[c.index("--incumbents") + 1]
    assert [opts(c) for c in stale[2:6:2] + stale[5:7]] == [opts(c) for c in (big[0], big[2], small[0], small[1])]
    assert stale[3] == big[1] and opts(stale[2])[3] == str(shipped)
    assert stale[7] == small[2] and all("--autotune-cache" in c and db in c for c in stale)
    # retime: every key at one candidate (the default, joined by the file's tile), then export
    retime = stage("retime")
    assert [c[0] for c in retime] == ["27b", "27b-hybrid", "minilm", "export"] and retime[3] == small[2]
    for c in retime[:3]:
        assert c[c.index("--max-candidates") + 1] == "1" and c[c.index("--incumbents") + 1] == str(shipped)
    assert "fp32" in retime[2][retime[2].index("--formats") + 1].split(",")
    # steady: the 27B-class keys of 256+ rows re-tuned into a scratch store at the same
    # counts, with incumbents; the file imported, the scratch store over it (its tiles preferred), export
    steady = stage("steady")
    assert [c[0] for c in steady] == ["27b", "27b", "import", "import", "export"]
    from vsr.autotune import buckets, tuner   # the script's default list, written out there
    sbuckets = ",".join(str(b) for b in buckets.ROW_BUCKETS if b >= tuner.STEADY_FROM_BUCKET)
    assert steady[0][2] == str(tmp_path / "h200.steady.db")
    assert steady[0][:2] + steady[0][3:] == big[0][:2] + big[0][3:] + ["--buckets", sbuckets]
    assert steady[1] == ["27b", "--autotune-cache", steady[0][2], "--formats", "int4-gptq,int4-awq",
                         "--max-candidates", "20", "--incumbents", str(shipped), "--buckets", sbuckets]
    assert steady[2] == ["import", str(shipped), "--autotune-cache", db]
    assert steady[3] == ["import", steady[0][2], "--autotune-cache", db, "--prefer-incoming"]
    assert steady[4] == small[2]
    assert stage("steady", STEADY_BUCKETS="1024")[0][-1] == "1024"
    # wgmma: int4's 27B-class and Qwen3.5 keys at 64-2,048 rows over the wgmma path's space, with
    # incumbents, into a scratch store; then as steady: the file, the scratch store over it, export
    wg = stage("wgmma")
    assert [c[0] for c in wg] == ["27b", "27b-hybrid", "import", "import", "export"]
    for c in wg[:2]:
        assert c[1:] == ["--autotune-cache", str(tmp_path / "h200.wgmma.db"), "--formats", "int4-gptq,int4-awq",
                         "--buckets", "64,128,256,1024,2048", "--paths", "wgmma", "--incumbents", str(shipped)]
    assert wg[2:] == [steady[2], ["import", wg[0][2], "--autotune-cache", db, "--prefer-incoming"], small[2]]
    assert stage("wgmma", WGMMA_BUCKETS="128")[1][6] == "128"
    assert [c[0] for c in stage("wgmma", WGMMA_SHAPES="27b")] == ["27b", "import", "import", "export"]
    # A finished stage removes its scratch store (and its lock files): a later run would otherwise
    # skip the keys it holds and import its old picks again.
    for name, scratch in (("steady", "h200.steady.db"), ("27b", "h200.27b-16.db"), ("wgmma", "h200.wgmma.db")):
        left = [tmp_path / scratch, tmp_path / (scratch + ".lock"), tmp_path / (scratch + ".locks")]
        left[0].write_text(""), left[1].write_text(""), left[2].mkdir()
        stage(name)
        assert not any(p.exists() for p in left), name
    for cmd in big + small + stale + steady + retime + wg:
        assert CliRunner().invoke(main, cmd + ["--help"]).exit_code == 0, cmd
    bad = subprocess.run(["bash", str(script), "everything", db], capture_output=True, text=True,
                         env={"PATH": "/usr/bin:/bin", "VSR_TUNE": "echo"}, timeout=60)
    assert bad.returncode == 2 and "unknown stage" in bad.stderr
    assert big[0][2] == str(tmp_path / "h200.27b-16.db")   # the scratch store's name ends in .db (ignored)
    spaced = tmp_path / "shipped cache.json"              # OUT_JSON is one path, blanks and all
    spaced.write_text("{}")
    quoting = tmp_path / "quoting-echo"                  # echo with each argument shell-quoted
    quoting.write_text('#!/bin/bash\nprintf "%q " "$@"; echo\n')
    quoting.chmod(0o755)
    cmd = stage("minilm", OUT_JSON=str(spaced), VSR_TUNE=str(quoting))
    assert cmd[0][cmd[0].index("--incumbents") + 1] == str(spaced) and cmd[-1][-1] == str(spaced)
    # Without OUT_JSON, the file rebuilt (and the incumbents) is the one beside the script, from any directory.
    p = subprocess.run(["bash", str(script), "minilm", db], capture_output=True, text=True, timeout=60,
                       cwd=tmp_path, env={"PATH": "/usr/bin:/bin", "VSR_TUNE": "echo"})
    default = [shlex.split(line) for line in p.stdout.splitlines()]
    assert p.returncode == 0 and Path(default[-1][-1]).resolve() == script.parent / "nvidia-h200.json"
    assert Path(default[0][default[0].index("--incumbents") + 1]).resolve() == script.parent / "nvidia-h200.json"


def test_a_tuned_package_runs_with_miss_policy_error(tmp_path):
    """Every product the forward runs is a key vsr-tune PACKAGE records: the model's products on
    the Triton templates (interpreter, fp16) with a resolver that refuses any miss."""
    from tinypkgs import Pkg, build_tiny_qwen3
    from vsr.autotune.buckets import bucket_for
    from vsr.autotune.resolver import TileResolver
    from vsr.runtime.engine import load_engine
    from vsr.runtime.linear import QLinear
    from vsr.runtime.loaders import PackageLoader
    from vsr.runtime.models import build_model
    from vsr.runtime.models.common import Builder

    pkg = build_tiny_qwen3(tmp_path / "q3")
    ref = load_engine(Pkg(pkg), dtype="float16")
    b = ref.tokenizer.batch(["turn on the lights"])
    bucket = bucket_for(b.input_ids.numel())
    cache = tmp_path / "fresh.db"
    run(pkg, "--buckets", bucket, "--act-dtype", "float16", "--max-candidates", "1", "--autotune-cache", cache,
        "--json")
    resolver = TileResolver(cache, policy="error", device="cpu")
    loader = PackageLoader(pkg, Pkg(pkg).config)
    builder = Builder(loader, lambda w: QLinear(w, "triton", tiles=resolver), torch.float16, "cpu", True)
    model = build_model(Pkg(pkg).config, builder).eval()
    loader.close()
    assert len(builder.linears) == 8 and all(q.mode == "triton" for q in builder.linears.values())
    with torch.no_grad():
        got = model(b.input_ids, b.attention_mask, b.lengths)
    torch.testing.assert_close(got, ref.model(b.input_ids, b.attention_mask, b.lengths), atol=2e-3, rtol=0)
    # A batch in a bucket the cache does not hold is refused (the policy is really "error").
    from tinypkgs import TEST_TEXTS
    other = ref.tokenizer.batch(TEST_TEXTS)
    assert bucket_for(other.input_ids.numel()) != bucket
    from vsr.autotune.resolver import CacheMiss
    with pytest.raises(CacheMiss, match="no tile recorded .* N=256 K=128"):
        with torch.no_grad():
            model(other.input_ids, other.attention_mask, other.lengths)
