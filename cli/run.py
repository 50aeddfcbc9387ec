"""vsr-run: answer requests with a router package; --check-device; `vsr-run eval` for the agreement record.

    vsr-run --text "turn on the kitchen lights"            # the built-in router
    vsr-run vsr/intent-minilm-FP8 --input requests.jsonl --json --emulate
    vsr-run --check-device --json
    vsr-run eval vsr/intent-minilm-FP8 --against vsr/intent-minilm
    vsr-run serve --port 8000                              # the HTTP service (docs/serve.md)

Order of work: parse the requests -> open the package (device check before any weight is
read, then the identity check) -> load the engine -> answer. A request that cannot be
answered (empty, broken JSONL line, over-long) is reported by its number while the others
are still answered; the exit code says whether anything failed.
"""
from __future__ import annotations

import json
import sys
from dataclasses import dataclass

import click

from vsr.cli.common import (EXIT_CODES_HELP, EXIT_MISMATCH, EXIT_OK, EXIT_REFUSED, EXIT_REQUEST_FAILED, describe_text,
                            echo_json, parse_device, reports_errors)
from vsr.runtime.errors import PackageError

DEFAULT_PACKAGE = "vsr/intent-minilm"
BATCH = 64   # requests per engine call (vsr.runtime.batcher.CLI_CHUNK): bounds memory, keeps the order fixed


@dataclass
class Request:
    number: int                # 1-based, in the order given: --text first, then --input lines
    text: str | None
    where: str                 # "--text 2" or "requests.jsonl line 7": how the user finds it
    error: str | None = None
    extra: dict | None = None  # "line" (JSONL line number) and an "id" from the line, echoed back


class _DefaultToRun(click.Group):
    """`vsr-run eval ...`, `vsr-run serve ...` and `vsr-run check-device` are subcommands; anything else is `run`."""

    def parse_args(self, ctx, args):
        if not args or args[0] not in self.commands:
            args = ["run", *args]
        return super().parse_args(ctx, args)


class _RootPathContext(click.Context):
    @property
    def command_path(self) -> str:
        return self.find_root().command_path


class _RunCommand(click.Command):
    """`run` is the default command: usage and hints read `vsr-run [OPTIONS] [PACKAGE]`, not `vsr-run run`."""
    context_class = _RootPathContext


@click.group(cls=_DefaultToRun, context_settings={"help_option_names": ["-h", "--help"]})
def main():
    """Run quantized router packages. See `vsr-run --help` (inference), `vsr-run serve --help` and
    `vsr-run eval --help`."""


def _read_requests(texts: tuple[str, ...], input_file) -> list[Request]:
    reqs = [Request(i + 1, t, f"--text {i + 1}") for i, t in enumerate(texts)]
    if input_file is None:
        return reqs
    name = getattr(input_file, "name", "-")
    src = "stdin" if name in ("<stdin>", "-") or not isinstance(name, str) else name
    for lineno, raw in enumerate(input_file, start=1):
        if not raw.strip():
            continue   # blank lines (a trailing newline, spacing) are not requests
        r = Request(len(reqs) + 1, None, f"{src} line {lineno}", extra={"line": lineno})
        reqs.append(r)
        try:
            # utf-8-sig: a byte-order mark at the start of the file is not part of line 1's JSON.
            obj = json.loads(raw.decode("utf-8-sig" if lineno == 1 else "utf-8"))
        except UnicodeDecodeError as e:
            r.error = f"not UTF-8 text ({e.reason} at byte {e.start})"
            continue
        except json.JSONDecodeError as e:
            r.error = f"broken JSON: {e.msg} at column {e.colno}"
            continue
        if not isinstance(obj, dict) or "text" not in obj:
            r.error = 'expected a JSON object with a "text" field, e.g. {"text": "turn on the lights"}'
        elif not isinstance(obj["text"], str):
            r.error = f'"text" must be a string, got {type(obj["text"]).__name__}'
        else:
            r.text = obj["text"]
            if "id" in obj:
                r.extra["id"] = obj["id"]
    return reqs


def _human_line(r: Request, result: dict, mode: str) -> str:
    tag = "  [emulated]" if mode == "emulated" else ""
    if "embedding" in result:
        emb = result["embedding"]
        head = ", ".join(f"{v:.4f}" for v in emb[:4])
        return f"[{r.number}] embedding[{len(emb)}] ({head}, ...){tag}"
    top = ", ".join(f"{label} {prob:.4f}" for label, prob in result["top"])
    return f"[{r.number}] {result['choice']}  ({top}){tag}"


def _list_builtins(as_json: bool) -> None:
    from vsr.runtime.package import builtin_names
    names = list(builtin_names())
    if as_json:
        echo_json({"builtin_packages": names, "default": DEFAULT_PACKAGE})
        return
    if not names:
        click.echo("no built-in packages in this install", err=True)
    for n in names:
        click.echo(n + ("  (default)" if n == DEFAULT_PACKAGE else ""))


def _check_device(device: str | None, as_json: bool) -> None:
    from vsr.runtime.device import describe
    from vsr.runtime.package import device_identity
    info = describe(device_identity(device))
    if as_json:
        echo_json(info)
    else:
        click.echo(describe_text(info))


@main.command("run", cls=_RunCommand, epilog=EXIT_CODES_HELP)
@click.argument("package", required=False, default=DEFAULT_PACKAGE)
@click.option("--text", "texts", multiple=True, metavar="TEXT", help="A request; repeat for several.")
@click.option("--input", "input_file", type=click.File("rb"), metavar="FILE",
              help='JSONL requests, one {"text": ...} per line ("-" reads stdin); an "id" field is echoed back.')
@click.option("--json", "as_json", is_flag=True, help="One JSON object per request (and per error) on stdout.")
@click.option("--dtype", type=click.Choice(["auto", "float32", "bfloat16", "float16"]), default="auto",
              show_default=True, help="auto: on a GPU the package's own precision with the Triton kernels (the "
                                      "approximate set for a quantized package: norms and activations round "
                                      "once), on the CPU the exact fp32 reference. An explicit dtype runs the same weights in "
                                      "that precision with exact kernels (never another package).")
@click.option("--revision", metavar="REV", help="Refuse the package unless its manifest has this revision.")
@click.option("--device", metavar="DEVICE", help="torch device, e.g. cpu, cuda, cuda:1 (default: a GPU if any).")
@click.option("--allow-unverified", is_flag=True,
              help="Load a package without MODEL_MANIFEST.json; its identity is reported unverified.")
@click.option("--emulate", is_flag=True,
              help="Run FP8/NVFP4 packages the device refuses with the reference numerics; every output is "
                   "labelled emulated.")
@click.option("--self-check", is_flag=True,
              help="Compare the package's answers with its recorded reference answers: verified, mismatch "
                   "(exit 5) or unverified (not a built-in package). Needs no --text.")
@click.option("--autotune-cache", type=click.Path(dir_okay=False), metavar="PATH",
              help="Autotune cache (SQLite or JSON export) to load tiles from, untimed (GPU only; default: "
                   "the shipped cache recorded on this exact device, if any).")
@click.option("--miss-policy", type=click.Choice(["default", "tune", "error"]), default="default",
              show_default=True, help="A tile missing from the autotune cache: default uses the template's fixed "
                                      "tile (with a warning), tune times candidates now and records the winner, "
                                      "error stops.")
@click.option("--top-k", type=click.IntRange(min=1), default=3, show_default=True,
              help="How many labels and probabilities to show per request.")
@click.option("--cuda-graphs/--no-cuda-graphs", default=None,
              help="On by default on a GPU (--no-cuda-graphs runs every batch eagerly): capture a batch shape (requests x padded tokens, both rounded up to a short "
                   "ladder on any GPU run) as a CUDA graph on its second use and replay it after, with the same "
                   "answers bit for bit: less host time per batch where shapes repeat. A shape's first use runs "
                   "eagerly and captures nothing; its second is answered by an eager run and then captured (the "
                   "capture is its extra cost); the most recently used graphs are kept.")
@click.option("--list", "list_only", is_flag=True, help="List the built-in packages and exit.")
@click.option("--check-device", is_flag=True,
              help="Show this device and which formats it runs, refuses (with the reason) or runs unmeasured.")
@reports_errors
def run(package, texts, input_file, as_json, dtype, revision, device, allow_unverified, emulate, self_check,
        autotune_cache, miss_policy, top_k, cuda_graphs, list_only, check_device):
    """Answer each request with PACKAGE (default vsr/intent-minilm): its top choice and probabilities.

    PACKAGE is a built-in name (see --list) or a package folder. The device is checked
    before any weight is read, then the package's identity against its MODEL_MANIFEST.json.

    Subcommands: `vsr-run serve [PACKAGE]` (the HTTP service, docs/serve.md), `vsr-run eval
    PACKAGE... --against vsr/intent-minilm` (the agreement record) and `vsr-run check-device`
    (same as --check-device).
    """
    if list_only:
        _list_builtins(as_json)
        return
    if check_device:
        _check_device(device, as_json)
        return
    if not texts and input_file is None and not self_check:
        raise click.UsageError("give requests with --text TEXT or --input FILE (or run --self-check)")

    dev = device or str(parse_device(None))
    if cuda_graphs and parse_device(dev).type != "cuda":   # before reading the requests (stdin, perhaps)
        raise click.UsageError(f"--cuda-graphs needs a CUDA device (the device is {dev})")
    requests = _read_requests(texts, input_file)

    from vsr.runtime.load import open_engine
    pkg, engine = open_engine(package, device=dev, revision=revision, allow_unverified=allow_unverified,
                              dtype=dtype, emulate=emulate, autotune_cache=autotune_cache, miss_policy=miss_policy,
                              cuda_graphs=cuda_graphs)
    mode = engine.mode
    kernels = engine.kernel_set
    if pkg.support == "emulated" and mode != "emulated":
        raise PackageError(f"the device check chose the emulation but the engine runs {mode!r}; refusing "
                           "to label its answers wrongly")
    click.echo(f"vsr-run: {pkg.name} revision {pkg.revision or '-'} (identity {pkg.identity_status}); "
               f"formats {', '.join(sorted(pkg.formats))}; device {dev}: {pkg.support}; mode {mode}; "
               f"kernels {kernels}{'; CUDA graphs' if engine.graphed is not None else ''}", err=True)

    mismatch = self_check and _self_check(engine, pkg.name, pkg.revision, as_json) == "mismatch"

    failed = False
    # BATCH requests at a time, in order: answers stream out, memory stays bounded, and the
    # same requests always form the same batches (so the same bits).
    for i in range(0, len(requests), BATCH):
        chunk = requests[i:i + BATCH]
        pending = [r for r in chunk if r.error is None]
        results = {}
        # One tokenizer pass per request: an empty or over-long text comes back as its error.
        for r, a in zip(pending, engine.answer([r.text for r in pending], top_k=top_k) if pending else [],
                        strict=True):
            if "error" in a:
                r.error = a["error"]
            else:
                results[r.number] = a
        for r in chunk:
            if r.error is not None:
                failed = True
                click.echo(f"vsr-run: request {r.number} ({r.where}): {r.error}", err=True)
                if as_json:
                    echo_json({"request": r.number, **(r.extra or {}), "error": r.error})
            elif as_json:
                echo_json({"request": r.number, **(r.extra or {}), **results[r.number], "mode": mode,
                           "kernel_set": kernels})
            else:
                click.echo(_human_line(r, results[r.number], mode))
    sys.exit(EXIT_MISMATCH if mismatch else EXIT_REQUEST_FAILED if failed else EXIT_OK)


def _self_check(engine, name: str, revision: str | None, as_json: bool) -> str:
    try:
        from vsr.runtime.builtin import self_check
    except ImportError as e:
        raise PackageError(f"--self-check needs the built-in packages (vsr.runtime.builtin): {e}")
    result = self_check(engine, name, revision=revision)
    status = result["status"]
    if as_json:
        echo_json({"self_check": result})
    else:
        detail = {k: v for k, v in result.items() if k != "status" and not isinstance(v, (list, dict))}
        extra = ", ".join(f"{k} {v}" for k, v in detail.items())
        click.echo(f"self-check: {status}" + (f" ({extra})" if extra else ""))
        for item in (result.get("differ") or [])[:10]:
            click.echo(f"  differs: {json.dumps(item, ensure_ascii=False)}")
    return status


@main.command("check-device")
@click.option("--json", "as_json", is_flag=True, help="Print the report as one JSON object.")
@click.option("--device", metavar="DEVICE", help="torch device to describe (default: a GPU if any, else the CPU).")
@reports_errors
def check_device_cmd(as_json, device):
    """Show this device and which formats it runs, refuses (with the reason) or runs unmeasured."""
    _check_device(device, as_json)


@main.command("eval", epilog="Exit codes: 0 every package measured; 2 bad options; 3 a package was refused "
                             "by the device (its row says why; --emulate runs FP8/NVFP4 anyway); 4 a package "
                             "error.")
@click.argument("packages", nargs=-1, required=True)
@click.option("--against", default=DEFAULT_PACKAGE, show_default=True, metavar="PACKAGE",
              help="The reference package whose top choices the agreement is measured against.")
@click.option("--json-out", type=click.Path(dir_okay=False), metavar="PATH", help="Write the record (JSON) here.")
@click.option("--record-dir", type=click.Path(file_okay=False), metavar="DIR",
              help="Write the record as DIR/record-<device>-<date>.json (e.g. benchmarks/results).")
@click.option("--json", "as_json", is_flag=True, help="Print the record as JSON instead of the table.")
@click.option("--limit", type=click.IntRange(min=1), help="Use this many test sentences (spread over the split).")
@click.option("--device", metavar="DEVICE", default="cpu", show_default=True, help="torch device to measure on.")
@click.option("--dtype", type=click.Choice(["auto", "float32", "bfloat16", "float16"]), default="auto",
              show_default=True, help="Activation precision, as for `vsr-run --dtype` (auto: fp32 on the CPU).")
@click.option("--emulate", is_flag=True,
              help="Run packages the device refuses (FP8, NVFP4) with the reference numerics, labelled emulated; "
                   "without it their rows record the refusal.")
@click.option("--speed-requests", type=click.IntRange(min=1), default=1024, show_default=True,
              help="Requests timed for requests per second.")
@click.option("--speed-rounds", type=click.IntRange(min=1), default=3, show_default=True,
              help="Alternating timing rounds per package (the median of each side is kept).")
@click.option("--no-st", is_flag=True, help="Skip the sentence-transformers speed comparison.")
@click.option("--threads", type=click.IntRange(min=1), help="torch CPU threads.")
@reports_errors
def eval_cmd(packages, against, json_out, record_dir, as_json, limit, device, dtype, emulate, speed_requests,
             speed_rounds, no_st, threads):
    """Measure PACKAGE... on the test split: accuracy, agreement with --against, weight memory, requests/s.

    Prints a table shaped like the seeds' format table (or the JSON record with --json).
    """
    try:
        from vsr.runtime import evaluate as ev
    except ImportError as e:
        raise PackageError(f"vsr-run eval needs vsr.runtime.evaluate, which is not available: {e}")
    record = ev.evaluate(list(packages), against=against, limit=limit, device=device, dtype=dtype,
                         emulate=emulate, speed_requests=speed_requests, speed_rounds=speed_rounds,
                         compare_st=not no_st, threads=threads,
                         progress=lambda msg: click.echo(f"vsr-run eval: {msg}", err=True))
    if json_out:
        from pathlib import Path
        Path(json_out).write_text(json.dumps(record, indent=1, sort_keys=True, ensure_ascii=False) + "\n")
        click.echo(f"vsr-run eval: wrote {json_out}", err=True)
    if record_dir:
        click.echo(f"vsr-run eval: wrote {ev.write_record(record, record_dir)}", err=True)
    if as_json:
        echo_json(record)
    else:
        click.echo(ev.format_table(record))
    if any("refused" in row for row in record.get("rows", [])):
        sys.exit(EXIT_REFUSED)


@main.command("serve", epilog="Exit codes: 0 stopped by SIGTERM/SIGINT after answering every accepted request; "
                              "2 bad options; 3 the device refuses the package; 4 a package error. "
                              "Endpoints, errors and metrics: docs/serve.md.")
@click.argument("package", required=False, default=DEFAULT_PACKAGE)
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on (0.0.0.0: every interface).")
@click.option("--port", type=click.IntRange(0, 65535), default=8000, show_default=True)
@click.option("--revision", metavar="REV", help="Refuse the package unless its manifest has this revision.")
@click.option("--dtype", type=click.Choice(["auto", "float32", "bfloat16", "float16"]), default="auto",
              show_default=True, help="As for `vsr-run --dtype`.")
@click.option("--device", metavar="DEVICE", help="torch device (default: a GPU if any); with --replicas and a bare "
                                                 "`cuda`, replica i runs on GPU i modulo the GPUs.")
@click.option("--autotune-cache", type=click.Path(dir_okay=False), metavar="PATH",
              help="Autotune cache every replica loads tiles from (as for `vsr-run --autotune-cache`).")
@click.option("--miss-policy", type=click.Choice(["default", "tune", "error"]), default="default", show_default=True,
              help="As for `vsr-run --miss-policy`.")
@click.option("--allow-unverified", is_flag=True, help="As for `vsr-run --allow-unverified`.")
@click.option("--emulate", is_flag=True, help="As for `vsr-run --emulate` (every answer says mode emulated).")
@click.option("--cuda-graphs/--no-cuda-graphs", default=None,
              help="As for `vsr-run --cuda-graphs/--no-cuda-graphs` (default: on for a GPU).")
@click.option("--replicas", type=click.IntRange(min=1), default=1, show_default=True,
              help="Engine processes behind the one port, one per GPU in turn (with --ray: Ray Serve replicas).")
@click.option("--http-workers", type=click.IntRange(min=1), default=None,
              help="uvicorn worker processes on the port (HTTP, JSON, tokenizing), each handing its calls to "
                   "the engine processes [default: 1 with one replica, else 2 per replica up to the CPUs].")
@click.option("--max-batch", type=click.IntRange(min=1), default=64, show_default=True,
              help="Most texts per batch the engine worker takes (and per call).")
@click.option("--max-wait-ms", type=click.FloatRange(min=0), default=2.0, show_default=True,
              help="--merge shared: how long a short batch waits for more calls.")
@click.option("--max-queue", type=click.IntRange(min=1), default=1024, show_default=True,
              help="Calls waiting for the engine before new ones get 503 with Retry-After.")
@click.option("--merge", type=click.Choice(["exact", "shared"]), default="exact", show_default=True,
              help="exact: each call's answers are the bytes `vsr-run` gives its inputs alone; shared: the calls "
                   "of a batch share engine batches (faster; answers within rounding of the alone answer).")
@click.option("--max-body-bytes", type=click.IntRange(min=1), default=1 << 20, show_default=True,
              help="Bodies over this get 413.")
@click.option("--top-k", type=click.IntRange(min=1), default=3, show_default=True,
              help='Labels in each answer\'s "top" unless the call sets "top_k".')
@click.option("--served-name", metavar="NAME", help='The "model" name callers use (default: the package name).')
@click.option("--ray", "use_ray", is_flag=True,
              help="Run as a Ray Serve deployment (the `ray` extra): Ray's HTTP proxy on --host/--port, --replicas "
                   "Ray Serve replicas (or --autoscale), on a local Ray instance or --ray-address.")
@click.option("--ray-address", metavar="ADDRESS", help="--ray: the Ray cluster to join (default: RAY_ADDRESS, else "
                                                       "a local instance).")
@click.option("--autoscale", metavar="MIN:MAX", help="--ray: Ray Serve's autoscaling between MIN and MAX replicas "
                                                     "(in place of --replicas).")
@click.option("--gpus-per-replica", type=click.FloatRange(min=0, min_open=True), default=1.0, show_default=True,
              help="--ray on a GPU: each replica's share of a GPU (0.5: two replicas share one).")
@reports_errors
def serve_cmd(package, host, port, revision, dtype, device, autotune_cache, miss_policy, allow_unverified, emulate,
              cuda_graphs, replicas, http_workers, max_batch, max_wait_ms, max_queue, merge, max_body_bytes, top_k,
              served_name, use_ray, ray_address, autoscale, gpus_per_replica):
    """Serve PACKAGE over HTTP: POST /v1/classify, /v1/embeddings; GET /v1/models, /health, /metrics.

    The package is opened with every check `vsr-run` makes (device, identity, revision) and its
    engine loaded before the port opens; SIGTERM stops accepting, answers what was accepted, exits 0.
    """
    if cuda_graphs and parse_device(device).type != "cuda":
        raise click.UsageError(f"--cuda-graphs needs a CUDA device (the device is {parse_device(device)})")
    try:
        from vsr.runtime.service import ServeConfig, default_http_workers, run_service
    except ImportError as e:
        raise click.UsageError(f"vsr-run serve needs Starlette, uvicorn and prometheus-client "
                               f"(pip install 'vsr[serve]'): {e}")
    cfg = ServeConfig(package=package, host=host, port=port, revision=revision, dtype=dtype,
                      device=str(parse_device(device)) if device else None, autotune_cache=autotune_cache,
                      miss_policy=miss_policy, allow_unverified=allow_unverified, emulate=emulate,
                      cuda_graphs=cuda_graphs, replicas=replicas,
                      http_workers=http_workers or default_http_workers(replicas), max_batch=max_batch,
                      max_wait_ms=max_wait_ms, max_queue=max_queue, merge=merge, max_body_bytes=max_body_bytes,
                      top_k=top_k, served_name=served_name)
    log = lambda msg: click.echo(msg, err=True)  # noqa: E731
    if not use_ray:
        if ray_address or autoscale:
            raise click.UsageError("--ray-address and --autoscale need --ray")
        run_service(cfg, log=log)
        return
    if http_workers:
        raise click.UsageError("--http-workers is for the service without --ray (Ray Serve runs its own HTTP proxy)")
    try:
        from vsr.runtime import ray_deployment as rd
    except ImportError as e:
        raise click.UsageError(f"--ray needs Ray Serve (pip install 'vsr[ray]'): {e}")
    try:
        opts = rd.RayOptions(autoscale=rd.parse_autoscale(autoscale) if autoscale else None, address=ray_address,
                             gpus_per_replica=gpus_per_replica)
        rd.replica_device(cfg)
    except ValueError as e:
        raise click.UsageError(str(e))
    rd.run_ray_service(cfg, opts, log=log)


if __name__ == "__main__":
    main()
