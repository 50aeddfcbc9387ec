"""vsr-tune: pre-record tiles into the shared autotune cache, and inspect / ship / check it.

    vsr-tune PACKAGE-or-SHAPES --autotune-cache PATH [--buckets 1,16|all] [--formats ...]
             [--jobs N] [--time-budget S] [--max-candidates N] [--paths P,...] [--incumbents CACHE ...] [--json]
    vsr-tune ls|show KEY|export|import SRC|merge SRC|verify|coverage PACKAGE --autotune-cache PATH

SHAPES is "27b", "27b-hybrid", "minilm" or "NxK[,NxK]" (with --formats); a PACKAGE is a built-in name or a
folder, whose Linear layers give (format, N, K). Tuning is resumable: recorded keys are skipped
and every key is committed as soon as it is tuned.
"""
from __future__ import annotations

import json
import os
import sys
import time
import warnings
from pathlib import Path

import click
from click_default_group import DefaultGroup

from vsr.autotune.buckets import parse_buckets
from vsr.autotune.device_id import DeviceIdentity
from vsr.autotune.keys import CacheKey
from vsr.autotune.store import CacheError, export_json, incumbent_tiles, merge, open_store
from vsr.cli.common import parse_device
from vsr.runtime.errors import VsrError


def _echo_json(obj) -> None:
    click.echo(json.dumps(obj, indent=1, sort_keys=True))


def _device(device: str | None):
    import torch
    dev = parse_device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise click.BadParameter(f"{device!r}: this machine has no CUDA device", param_hint="--device")
    return dev


def _dtype(name: str | None):
    from vsr.autotune.shapes import _DT
    if name is None:
        return None
    if name not in _DT:
        raise click.BadParameter(f"{name!r} is not one of {', '.join(_DT)}")
    return _DT[name]


# --- what to tune ----------------------------------------------------------------------------

def package_jobs(target: str, device, buckets, act: str | None) -> list[dict]:
    """(label, template, weight, problem) for every distinct product shape a package's forward runs:
    q|k|v and gate|up as the fused weights the runtime loads (runtime/fuse.py; where the parts
    cannot all be fused, the runs of them that can and the rest one by one, as the runtime then
    runs them: fuse.fuse_runs)."""
    from vsr.autotune.jobs import choose_template, weight_jobs
    from vsr.runtime import fuse
    from vsr.runtime.linear import to_run_dtype
    from vsr.runtime.loaders import PackageLoader
    from vsr.runtime.models import linear_names, products
    from vsr.runtime.package import open_package

    pkg = open_package(target, allow_unverified=True, device=device)
    config = pkg.config
    act_dtype = _dtype(act) or pkg.model_dtype
    jobs, seen = [], set()
    loader = PackageLoader(pkg.path, config)

    def run_dtype(w):
        return to_run_dtype(w, act_dtype) if w.format == "dense" and w.weight.dtype != act_dtype else w

    try:  # closed whether the model is known or not
        loader.check_linears(linear_names(config, loader))
        for label, names in products(config, loader):
            parts = [run_dtype(loader.linear(n)) for n in names]
            todo = [(fuse.run_label(label, names, i, j), parts[i] if w is None else w)
                    for i, j, w in fuse.fuse_runs(parts)]
            for name, w in todo:
                try:
                    template = choose_template(w, act_dtype, False, f"{target}: {name}")
                except ValueError as e:
                    raise VsrError(str(e)) from None
                sig = (template.name, w.N, w.K, tuple(w.params()))
                if sig in seen:
                    continue
                seen.add(sig)
                jobs += weight_jobs(f"{name} ({w.format})", template, w.to(device), buckets, act_dtype)
    finally:
        loader.close()
    return jobs


def build_jobs(target, formats, device, identity, buckets, act):
    from vsr.autotune import shapes
    from vsr.autotune.jobs import shape_jobs
    from vsr.runtime.device import device_formats
    if shapes.looks_like_shape_spec(target) and not Path(target).exists():
        return shape_jobs(target, formats or ",".join(device_formats(identity)), device, buckets, act)
    if formats:
        raise click.UsageError("--formats applies to shape specs; a package's formats come from its config")
    try:
        return package_jobs(target, device, buckets, act)
    except VsrError as e:
        if target[:1].isdigit():  # most likely a mistyped shape spec
            try:
                shapes.parse_shapes(target)
            except ValueError as shape_err:
                raise VsrError(f"{e}; as a shape spec: {shape_err}") from None
        raise


# --- the command group -----------------------------------------------------------------------

cache_option = click.option("--autotune-cache", "cache", required=True, type=click.Path(dir_okay=False),
                            help="The cache file: .db (SQLite, the working form) or .json (the shipped form).")
json_option = click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
# Shared by tune and coverage (and --device by verify): the same words for the same option.
buckets_option = click.option("--buckets", default="all", show_default=True,
                              help="Row buckets, e.g. 1,16,256, or all.")
formats_option = click.option("--formats", default=None,
                              help="For shape specs: bf16,fp16,fp32,fp8,int4-gptq,int4-awq,nvfp4,nvfp4-emulated, "
                                   "a quantized one optionally with its activation dtype (fp8@fp32) "
                                   "(default: what this device runs).")
act_dtype_option = click.option("--act-dtype", default=None,
                                help="Activation dtype of quantized formats (default: bf16, or the package's "
                                     "dtype).")
device_option = click.option("--device", default=None, help="torch device (default: cuda if present, else cpu).")


@click.group(cls=DefaultGroup, default="tune", default_if_no_args=False)
def main():
    """Record, inspect and ship autotune tiles.

    `vsr-tune TARGET --autotune-cache PATH` is `vsr-tune tune ...`: TARGET is a package (a
    built-in name or a folder) or a shape spec ("27b", "27b-hybrid" (Qwen3.5's), "minilm" or "NxK[,NxK]").

    Exit codes: 0 done; 1 a key failed to tune, an entry failed verify, or a merge conflict
    was left; 2 bad options or an unusable cache or package.
    """


def _fail(msg: str) -> None:
    click.echo(f"vsr-tune: {msg}", err=True)
    sys.exit(2)


@main.command("tune")
@click.argument("target")
@cache_option
@buckets_option
@formats_option
@act_dtype_option
@click.option("--jobs", default=None, type=int, help="Threads compiling candidates in parallel.")
@click.option("--time-budget", default=None, type=float, help="Seconds; no new key starts after it (resume later).")
@click.option("--max-candidates", default=None, type=click.IntRange(min=1),
              help="Try N tiles of each search space: the default tile, then a pick over the "
                   "rest that gives each kernel path its share when N is large enough (see "
                   "vsr.autotune.tuner.candidates), else an even spread, its last tile included; "
                   "plus the --incumbents the pick left out.")
@click.option("--incumbents", "incumbents_from", multiple=True, type=click.Path(exists=True, dir_okay=False),
              help="A cache file (.json or .db; repeatable) whose tile for a key, tuned for any kernel "
                   "source or Triton, joins that key's --max-candidates pick when the search space "
                   "still holds it: a re-tune then cannot lose a tile it already had (without "
                   "--max-candidates the whole space is tried anyway).")
@click.option("--paths", default=None,
              help="Comma-separated kernel paths (a tile's \"path\", e.g. frag,wgmma): try only the "
                   "search space's tiles of those paths (then the --max-candidates pick, if given), "
                   "plus the --incumbents. A key whose space has none fails.")
@device_option
@json_option
def tune_cmd(target, cache, buckets, formats, act_dtype, jobs, time_budget, max_candidates, incumbents_from,
             paths, device, as_json):
    """Tune every (format, N, K, bucket) of a PACKAGE or shape spec that the cache lacks."""
    from vsr.autotune.resolver import TileResolver

    t0 = time.monotonic()
    dev = _device(device)
    paths = tuple(p for p in paths.split(",") if p) if paths else None
    if incumbents_from and max_candidates is None and not paths:
        click.echo("vsr-tune: note: --incumbents matters only with --max-candidates or --paths (the whole "
                   "search space is tried without them)", err=True)
    try:
        bks = parse_buckets(buckets)
        incumbents = incumbent_tiles(incumbents_from)   # before the cache is opened: a bad file creates nothing
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # said once below, as a vsr-tune message
            resolver = TileResolver(cache, "tune", dev, jobs=jobs)
        if resolver.problem and resolver.store is None:
            _fail(f"{resolver.problem}; not tuning into it (move it away or name another file)")
        if resolver.problem:  # e.g. the file holds another device's tiles: ours are added beside them
            click.echo(f"vsr-tune: note: {resolver.problem}", err=True)
        work = build_jobs(target, formats, dev, resolver.identity, bks, act_dtype)
    except (VsrError, CacheError, ValueError) as e:
        _fail(str(e))
    keys = [resolver.key(j["template"], j["problem"]) for j in work]
    report = {"cache": str(cache), "target": target, "device": resolver.identity.name,
              "keys": len(work), "tuned": [], "recorded_before": 0, "skipped": [], "failed": []}
    key_incumbents = [incumbents.get(k.lineage()) for k in keys]
    if incumbents_from:   # how many keys the files had a tile for (none: the wrong device or shapes?)
        report["keys_with_incumbents"] = sum(inc is not None for inc in key_incumbents)
    deadline = None if time_budget is None else t0 + time_budget
    tuned_s: list[float] = []
    tty = sys.stderr.isatty()
    for i, (job, key, key_inc) in enumerate(zip(work, keys, key_incumbents, strict=True), 1):
        if deadline is not None and time.monotonic() > deadline:
            report["skipped"].append(key.short())
            continue
        k0 = time.monotonic()

        def progress(done, total, tile, i=i, key=key, k0=k0):
            if not tty:  # logs get one line per key (below), not a line per candidate
                return
            left = _eta(tuned_s, len(work) - i)
            click.echo(f"\r[{i}/{len(work)}] {key.short()}  candidates {done}/{total}  "
                       f"{time.monotonic() - k0:5.1f}s{left}", err=True, nl=False)
        try:
            _, tuned_now = resolver.tune(job["template"], job["problem"], weight=job["weight"],
                                         progress=progress, max_candidates=max_candidates,
                                         incumbents=key_inc, paths=paths)
        except (CacheError, ValueError, RuntimeError) as e:
            report["failed"].append({"key": key.short(), "error": str(e)})
            click.echo(f"\n[{i}/{len(work)}] {key.short()}: FAILED: {e}", err=True)
            continue
        if tuned_now:
            tuned_s.append(time.monotonic() - k0)
            report["tuned"].append(key.short())
            click.echo(("\n" if tty else "") + f"[{i}/{len(work)}] {key.short()} tuned in "
                       f"{tuned_s[-1]:.1f}s{_eta(tuned_s, len(work) - i)}", err=True)
        else:
            report["recorded_before"] += 1
    report["seconds"] = round(time.monotonic() - t0, 3)
    report["timing_calls"] = resolver.timing_calls
    if as_json:
        _echo_json(report)
    else:
        inc = (f", {report['keys_with_incumbents']} of {len(work)} keys with incumbents"
               if "keys_with_incumbents" in report else "")
        click.echo(f"{len(report['tuned'])} keys tuned, {report['recorded_before']} already recorded, "
                   f"{len(report['skipped'])} skipped (time budget), {len(report['failed'])} failed{inc}, "
                   f"in {report['seconds']:.1f} s -> {cache}")
    sys.exit(1 if report["failed"] else 0)


def _eta(tuned_s: list[float], remaining: int) -> str:
    if not tuned_s:
        return ""
    return f"  ~{sum(tuned_s) / len(tuned_s) * remaining:.0f}s left"


def _open(cache, create=False):
    try:
        return open_store(cache, create=create)
    except CacheError as e:
        _fail(str(e))


def entry_row(e) -> dict:
    from vsr.autotune.shapes import format_label
    ident = DeviceIdentity.from_key(e.key.device)
    return {"device": ident.name, "arch": ident.arch, "multiprocessors": ident.multiprocessors,
            "device_identity": json.loads(e.key.device), "format": format_label(e.key),
            "template": e.key.template, "N": e.key.N, "K": e.key.K, "bucket": e.key.bucket,
            "act_dtype": e.key.act_dtype, "params": json.loads(e.key.params), "tile": e.tile, "ms": e.ms,
            "triton": e.key.triton, "source_hash": e.key.source_hash, "digest": e.digest, "tuned_at": e.tuned_at}


@main.command("ls")
@cache_option
@json_option
def ls_cmd(cache, as_json):
    """List the cache's entries."""
    rows = [entry_row(e) for e in _open(cache).entries()]
    if as_json:
        _echo_json(rows)
        return
    click.echo(f"{'digest':12} {'device':22} {'format':14} {'N':>6} {'K':>6} {'bucket':>6} {'ms':>9}  tile")
    for r in rows:
        ms = f"{r['ms']:.4f}" if r["ms"] is not None else "-"
        click.echo(f"{r['digest'][:12]:12} {r['device'][:22]:22} {r['format']:14} {r['N']:>6} {r['K']:>6} "
                   f"{r['bucket']:>6} {ms:>9}  {json.dumps(r['tile'], sort_keys=True)}")
    click.echo(f"{len(rows)} entries", err=True)


@main.command("show")
@click.argument("key")
@cache_option
@json_option
def show_cmd(key, cache, as_json):
    """One entry in full (KEY: a digest, a unique digest prefix, or a canonical key)."""
    store = _open(cache)
    if key.startswith("{"):
        key = CacheKey.from_canonical(key).digest()
    hits = [e for e in store.entries() if e.digest.startswith(key)]
    if len(hits) != 1:
        _fail(f"{len(hits)} entries match {key!r} in {cache}" + (" (give more digits)" if hits else ""))
    e = hits[0]
    doc = {**entry_row(e), "candidates": e.candidates, "versions": e.versions}
    if as_json:
        _echo_json(doc)
    else:
        for k, v in doc.items():
            click.echo(f"{k}: {json.dumps(v, sort_keys=True) if not isinstance(v, str) else v}")


@main.command("export")
@click.option("--autotune-cache", "cache", type=click.Path(dir_okay=False),
              help="The cache file to export (not with --bundle).")
@click.option("--out", "out", required=True, type=click.Path(dir_okay=False), help="The file to write.")
@click.option("--bundle", "bundle_path", type=click.Path(exists=True, dir_okay=False), default=None,
              help="Export this compiled-kernel bundle (checked first) instead of a cache.")
@json_option
def export_cmd(cache, out, bundle_path, as_json):
    """Write the cache as canonical, sorted JSON (the shipped and reviewed form; byte-stable), or
    copy a compiled-kernel bundle once every file matches its checksum (--bundle)."""
    if bundle_path is not None:
        import shutil

        from vsr.autotune import bundle
        try:
            _, manifest = bundle.unpack(bundle_path, _bundles_root())
        except bundle.BundleError as e:
            _fail(str(e))
        shutil.copyfile(bundle_path, out)
        if as_json:
            _echo_json({"exported": manifest["kernels"], "out": out})
        else:
            click.echo(f"{manifest['kernels']} kernels -> {out}")
        return
    if cache is None:
        raise click.UsageError("give --autotune-cache (or --bundle)")
    n = export_json(_open(cache), out)
    if as_json:
        _echo_json({"exported": n, "out": out})
    else:
        click.echo(f"{n} entries -> {out}")


def _merge(src, cache, prefer_incoming, as_json):
    dst = _open(cache, create=True)
    report = merge(dst, _open(src), prefer_incoming=prefer_incoming)
    if as_json:
        _echo_json(report)
    else:
        click.echo(f"{report['added']} added, {report['identical']} identical, {len(report['conflicts'])} "
                   f"conflicts ({report['replaced']} replaced by the incoming tile)")
        for c in report["conflicts"]:
            k = CacheKey.from_dict(c["key"])
            click.echo(f"  conflict {k.short()}: existing {json.dumps(c['existing'], sort_keys=True)} "
                       f"incoming {json.dumps(c['incoming'], sort_keys=True)} -> kept {c['kept']}")
    sys.exit(1 if report["conflicts"] and not prefer_incoming else 0)


@main.command("merge")
@click.argument("src", type=click.Path(exists=True, dir_okay=False))
@cache_option
@click.option("--prefer-incoming", is_flag=True, help="On a conflict take SRC's tile (default: keep ours).")
@json_option
def merge_cmd(src, cache, prefer_incoming, as_json):
    """Merge SRC (.db or .json) into the cache; conflicts are reported (exit 1 unless resolved)."""
    _merge(src, cache, prefer_incoming, as_json)


@main.command("import")
@click.argument("src", type=click.Path(exists=True, dir_okay=False))
@click.option("--autotune-cache", "cache", type=click.Path(dir_okay=False),
              help="The cache to merge SRC into (a cache SRC; a kernel bundle needs none).")
@click.option("--prefer-incoming", is_flag=True, help="On a conflict take SRC's tile (default: keep ours).")
@json_option
def import_cmd(src, cache, prefer_incoming, as_json):
    """Merge SRC (.db or .json) into the cache, or install a compiled-kernel bundle
    (*.bundle.tar.gz: checked, then copied to $VSR_CACHE_DIR/bundles/installed, where vsr-run finds it)."""
    from vsr.autotune import bundle
    if src.endswith(bundle.SUFFIX):
        _import_bundle(src, as_json)
        return
    if cache is None:
        raise click.UsageError("--autotune-cache is required to import a cache")
    _merge(src, cache, prefer_incoming, as_json)


def _bundles_root() -> Path:
    from vsr.runtime.paths import cache_root
    return cache_root() / "bundles"


def _import_bundle(src: str, as_json: bool) -> None:
    import shutil

    from vsr.autotune import bundle
    try:
        _, manifest = bundle.unpack(src, _bundles_root())   # every checksum, before it is installed
    except bundle.BundleError as e:
        _fail(str(e))
    dest_dir = bundle.installed_dir(_bundles_root())
    dest_dir.mkdir(parents=True, exist_ok=True)
    dest = dest_dir / Path(src).name
    shutil.copyfile(src, dest)
    row = {"installed": str(dest), "device": manifest["device_name"], "triton": manifest["triton"],
           "kernels": manifest["kernels"], "bytes": dest.stat().st_size}
    if as_json:
        _echo_json(row)
    else:
        click.echo(f"installed {dest}: {row['kernels']} kernels for {row['device']}, Triton {row['triton']}")


@main.command("compile")
@click.option("--autotune-cache", "cache", type=click.Path(exists=True, dir_okay=False),
              help="Compile every tile this cache records for this device (default: the shipped cache of "
                   "this device, which holds the 27B-class and MiniLM keys).")
@click.option("--package", "packages", multiple=True, metavar="PACKAGE",
              help="Also run this package's engine at every batch shape of its ladder (repeatable).")
@click.option("--out", type=click.Path(dir_okay=False),
              help="The bundle to write (default: beside the cache, <cache stem>.triton-<version>.bundle.tar.gz).")
@click.option("--jobs", "workers", type=click.IntRange(min=1), default=None,
              help="Processes compiling in parallel (default: the CPU count, at most 16).")
@device_option
@json_option
def compile_cmd(cache, packages, out, workers, device, as_json):
    """Compile the kernels of every (template, tile) the cache (and each --package) needs on this
    device into a compiled-kernel bundle, which vsr-run then loads instead of compiling."""
    import tempfile

    from vsr.autotune import bundle, kernel_compile
    from vsr.autotune.device_id import current_device_identity
    from vsr.autotune.keys import kernel_source_hash, triton_version
    from vsr.autotune.resolver import shipped_cache_for
    from vsr.kernels.registry import TEMPLATES

    dev = _device(device)
    if dev.type != "cuda":
        _fail("compile needs the GPU the bundle is for (kernels are compiled by launching them there)")
    ident = current_device_identity(dev)
    tv = triton_version()
    cache = cache or (str(shipped_cache_for(ident)) if shipped_cache_for(ident) else None)
    if cache is None and not packages:
        _fail(f"no shipped autotune cache for {ident.name}: give --autotune-cache or --package")
    workers = workers or min(16, os.cpu_count() or 1)
    jobs, keys = [], []
    if cache is not None:
        jobs, keys, _ = kernel_compile.cache_jobs(_open(cache), ident, tv)
    for p in packages:
        from vsr.runtime.kernel_warmup import package_jobs
        jobs += package_jobs(p, cache, workers)
    if not jobs:
        _fail(f"nothing to compile: {cache} records no current tile for {ident.name} with Triton {tv}")
    if out is None:
        stem = Path(cache).stem if cache else "packages"
        out = str((Path(cache).parent if cache else Path.cwd()) / bundle.default_name(stem, tv))
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="vsr-compile-") as staging:
        kernel_compile.compile_into(Path(staging), jobs, workers=workers, device_index=dev.index or 0,
                                    progress=None if as_json else
                                    lambda d, n: click.echo(f"vsr-tune compile: {d}/{n} jobs", err=True))
        manifest = bundle.write_bundle(
            staging, out, identity=ident, triton_version=tv,
            source_hashes={n: kernel_source_hash(t) for n, t in TEMPLATES.items()}, keys=keys,
            extra={"autotune_cache": Path(cache).name if cache else None, "packages": list(packages),
                   "compile_s": round(time.perf_counter() - t0, 1)})
    row = {"out": out, "kernels": manifest["kernels"], "files": len(manifest["files"]),
           "bytes": Path(out).stat().st_size, "cache_keys": len(keys), "compile_s": manifest["compile_s"]}
    if as_json:
        _echo_json(row)
    else:
        click.echo(f"{out}: {row['kernels']} kernels ({row['files']} files, {row['bytes'] / 1e6:.1f} MB) for "
                   f"{len(keys)} cache keys and {len(packages)} packages in {row['compile_s']} s")


def _source_stale(e) -> str | None:
    """Why entry e can never be read by this vsr (its template is gone, or its kernel source
    changed since it was tuned), or None. Device and Triton version aside: an entry of another
    device or Triton release stays valid there."""
    from vsr.autotune.keys import kernel_source_hash
    from vsr.kernels.registry import TEMPLATES

    t = TEMPLATES.get(e.key.template)
    if t is None:
        return f"no template named {e.key.template!r} in this vsr"
    if kernel_source_hash(t) != e.key.source_hash:
        return "stale: the template's source changed since this tile was tuned"
    return None


@main.command("prune")
@cache_option
@click.option("--dry-run", is_flag=True, help="List what would be removed; change nothing.")
@json_option
def prune_cmd(cache, dry_run, as_json):
    """Remove the entries this vsr can never read: their template's kernel source changed since
    they were tuned (or the template is gone). After a kernel change: import the shipped file,
    prune, tune (only the missing keys are tuned), export."""
    store = _open(cache)
    stale = [(e, _source_stale(e)) for e in store.entries()]
    stale = [(e, why) for e, why in stale if why is not None]
    removed = 0 if dry_run else store.delete(e.digest for e, _ in stale)
    if as_json:
        _echo_json({"stale": len(stale), "removed": removed, "dry_run": dry_run,
                    "entries": [{"digest": e.digest, "key": e.key.short(), "why": why} for e, why in stale]})
    else:
        for e, why in stale:
            click.echo(f"{'would remove' if dry_run else 'removed'} {e.key.short()}: {why}")
        click.echo(f"{len(stale)} stale entries{' (dry run: none removed)' if dry_run else f', {removed} removed'}")


@main.command("verify")
@cache_option
@device_option
@json_option
def verify_cmd(cache, device, as_json):
    """Re-check every entry of this device: its kernel source is current, it compiles, and it
    passes the reference check (nothing is timed)."""
    from vsr.autotune import synth, tuner
    from vsr.autotune.device_id import current_device_identity
    from vsr.autotune.keys import make_key, triton_version
    from vsr.autotune.shapes import _DT as _DT_BY_NAME
    from vsr.kernels.registry import TEMPLATES

    dev = _device(device)
    ident = current_device_identity(dev)
    mine, this_triton = ident.key(), triton_version()
    rows = []
    for e in _open(cache).entries():
        if e.key.device != mine:
            continue
        t = TEMPLATES.get(e.key.template)
        row = {"digest": e.digest, "key": e.key.short(), "ok": False, "error": None}
        stale = _source_stale(e)
        if stale is not None:
            row["error"] = stale
        elif e.key.triton != this_triton:
            row["error"] = (f"stale: tuned with Triton {e.key.triton}, this is Triton {this_triton} "
                            "(the runtime never reads this entry here)")
        elif e.key.act_dtype not in _DT_BY_NAME:
            row["error"] = f"activation dtype {e.key.act_dtype!r} is not one vsr runs"
        else:
            act = _DT_BY_NAME[e.key.act_dtype]
            w = synth.random_weight(synth.weight_format(t.name), e.key.N, e.key.K, json.loads(e.key.params),
                                    act, dev)
            x = synth.random_activations(e.key.bucket, e.key.K, act, dev)
            p = t.problem(w, e.key.bucket, act)
            rebuilt = make_key(t, p, ident, triton=e.key.triton)
            if rebuilt != e.key:
                # The check would run another problem than the one the entry is recorded for.
                row["error"] = (f"cannot rebuild this key's problem: a synthetic weight of its parameters "
                                f"{e.key.params} gives {rebuilt.params}")
            else:
                res = tuner.sweep(t, w, x, tiles=[e.tile], problem=p, timed=False)
                row["ok"], row["error"] = res[0]["ok"], res[0]["error"]
        rows.append(row)
    bad = [r for r in rows if not r["ok"]]
    if as_json:
        _echo_json({"checked": len(rows), "failed": len(bad), "entries": rows})
    else:
        for r in bad:
            click.echo(f"FAIL {r['key']}: {r['error']}")
        click.echo(f"{len(rows) - len(bad)} of {len(rows)} entries of this device pass")
    sys.exit(1 if bad else 0)


@main.command("coverage")
@click.argument("target")
@cache_option
@buckets_option
@formats_option
@act_dtype_option
@device_option
@json_option
def coverage_cmd(target, cache, buckets, formats, act_dtype, device, as_json):
    """Which of a PACKAGE's (or shape spec's) keys this device has in the cache."""
    from vsr.autotune.resolver import TileResolver

    dev = _device(device)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # an other-device file is simply zero coverage here
        try:
            resolver = TileResolver(cache, "default", dev)
            work = build_jobs(target, formats, dev, resolver.identity, parse_buckets(buckets), act_dtype)
        except (VsrError, CacheError, ValueError) as e:
            _fail(str(e))
    have = {e.digest for e in resolver.store.entries()} if resolver.store is not None else set()
    rows = []
    for job in work:
        k = resolver.key(job["template"], job["problem"])
        rows.append({"layer": job["label"], "template": k.template, "N": k.N, "K": k.K, "bucket": k.bucket,
                     "digest": k.digest(), "recorded": k.digest() in have})
    n_have = sum(r["recorded"] for r in rows)
    doc = {"target": target, "device": resolver.identity.name, "keys": len(rows), "recorded": n_have,
           "missing": [r for r in rows if not r["recorded"]], "problem": resolver.problem}
    if as_json:
        _echo_json(doc)
    else:
        click.echo(f"{n_have} of {len(rows)} keys recorded for {resolver.identity.name}")
        for r in doc["missing"]:
            click.echo(f"  missing: {r['layer']} {r['template']} N={r['N']} K={r['K']} bucket={r['bucket']}")


if __name__ == "__main__":   # python -m vsr.cli.tune, where the vsr-tune entry point is not installed
    main()


if __name__ == "__main__":
    main()
