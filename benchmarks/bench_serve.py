"""Service: requests/s and p50/p99 latency of `vsr-run serve` through a real HTTP client (issue 40, point 6).

The service runs in a process of its own (vsr.runtime.service.run_service, the function `vsr-run
serve` calls, on a free port; timing starts once /health says ready). At each concurrency level, C
client workers (one keep-alive connection each, spread over --client-procs processes) send one
held-out test sentence per call to POST /v1/classify back to back: requests per second over the
level's wall time, and p50 / p99 of each call's latency (send to body read).
Beside it, `in-process`: the same engine and the same Batcher (max batch, max wait, merging rule)
driven by C asyncio tasks in this process (tokenize, submit, await), no HTTP. The client's own
ceiling is measured at each level against a canned-answer server (a bare asyncio HTTP/1.1 server
that parses nothing and answers every call with a body the size of a real answer): an http figure
near it is the client's limit, not the service's (`client_bound` on its row). --client picks the
client library: aiohttp (one session and keep-alive pool a client process; the default where it is
installed) costs a client process less per call than httpx, so fewer of the host's cores go to
the load itself.

Each level runs --requests calls (or for --duration seconds) after a warm-up of --warmup calls at
the same concurrency (CUDA graphs capture their shapes there). Writes `serve-<device>-<date>.json`
(BENCHMARKS.md, the `serve` schema): rows with `device`, `concurrency`, `provider` (`http` or
`in-process`), `req_per_s`, `p50_ms`, `p99_ms`, `requests`, `errors`, and the targets of issue 40,
each met or missed, printed with the table last.

    python benchmarks/bench_serve.py [--device cuda] [--package vsr/intent-minilm] [--concurrency 1,8,64,256]
        [--requests 2000 | --duration S] [--max-batch 64] [--max-wait-ms 2] [--merge shared]
        [--replicas 1] [--http-workers W] [--client-procs 1] [--texts-file FILE] [--out FILE|DIR]
    python benchmarks/bench_serve.py --write-texts texts.jsonl   # the sentences, for --texts-file elsewhere
"""
from __future__ import annotations

import argparse
import asyncio
import gc
import json
import math
import multiprocessing
import os
import platform
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

ROUTER = "vsr/intent-minilm"
# Issue 40, point 6, on the H200 at concurrency 64: http requests/s, http p99, http's shortfall against in-process.
TARGET_RPS, TARGET_P99_MS, TARGET_OVERHEAD, TARGET_AT = 5000.0, 25.0, 0.20, 64
CLIENT_BOUND = 0.7   # an http row at this share of the client's ceiling or more is marked client-bound
# The launcher of the service process: the runtime's own entry, as `vsr-run serve` calls it.
LAUNCH = ("import json, sys\nfrom vsr.runtime.service import ServeConfig, run_service\n"
          "run_service(ServeConfig(**json.loads(sys.argv[1])), log=lambda m: print(m, file=sys.stderr, flush=True))")


def held_out_texts(n: int) -> list[str]:
    """n sentences spread over the built-in router's held-out test split (vsr.runtime.intents)."""
    from vsr.runtime.intents import load_split
    test = load_split()["test"]
    return [test[i * len(test) // n].text for i in range(n)]


def read_texts(path: str) -> list[str]:
    """The texts of a JSONL file, one {"text": ...} per line (as --write-texts writes and `vsr-run
    --input` reads)."""
    texts = [json.loads(line)["text"] for line in Path(path).read_text().splitlines() if line.strip()]
    if not texts:
        raise ValueError(f"{path} holds no texts")
    return texts


def percentile(sorted_values: list[float], q: float) -> float:
    """The q-quantile (0..1) of sorted values, nearest rank."""
    if not sorted_values:
        return float("nan")
    return sorted_values[min(len(sorted_values) - 1, max(0, math.ceil(q * len(sorted_values)) - 1))]


def summary(latencies_s: list[float], wall_s: float, errors: int) -> dict:
    lat = sorted(x * 1e3 for x in latencies_s)
    return {"req_per_s": round(len(lat) / wall_s, 1) if wall_s > 0 else 0.0, "p50_ms": round(percentile(lat, 0.5), 3),
            "p99_ms": round(percentile(lat, 0.99), 3), "requests": len(lat), "errors": errors,
            "wall_s": round(wall_s, 3)}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---- closed-loop drivers: C workers, each one call at a time -------------------------------

async def closed_loop(calls: list, requests: int, duration: float | None, warmup: int,
                      ready=None) -> tuple[list[float], float, int]:
    """(latencies, wall seconds, errors) of one worker per entry of `calls`, each calling its
    `call(i)` (True when the answer is right) back to back: first `warmup` untimed calls, then
    `requests` calls (or calls until `duration` seconds have passed). `ready()`, where given, runs
    between the two (a barrier across client processes)."""
    async def run(n: int, deadline: float | None, out: list | None) -> int:
        counter = iter(range(10 ** 12 if deadline else n))
        errors = 0

        async def worker(call):
            nonlocal errors
            for i in counter:
                if deadline is not None and time.perf_counter() >= deadline:
                    return
                t0 = time.perf_counter()
                ok = await call(i)
                if out is not None:
                    if ok:
                        out.append(time.perf_counter() - t0)
                    else:
                        errors += 1
        await asyncio.gather(*(worker(call) for call in calls))
        return errors

    if warmup:
        await run(warmup, None, None)
    if ready is not None:
        await asyncio.get_running_loop().run_in_executor(None, ready)
    lat: list[float] = []
    t0 = time.perf_counter()
    errors = await run(requests, None if duration is None else t0 + duration, lat)
    return lat, time.perf_counter() - t0, errors


async def http_level(url: str, texts: list[str], concurrency: int, requests: int, duration: float | None,
                     warmup: int, offset: int, ready, client: str) -> tuple[list[float], float, int]:
    """One level's calls from this process through `client` ("httpx" or "aiohttp")."""
    level = _aiohttp_level if client == "aiohttp" else _httpx_level
    return await level(url, texts, concurrency, requests, duration, warmup, offset, ready)


async def _aiohttp_level(url, texts, concurrency, requests, duration, warmup, offset, ready):
    """One aiohttp session whose pool holds a keep-alive connection per worker."""
    import aiohttp
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(url, connector=connector, timeout=aiohttp.ClientTimeout(total=120)) as session:
        async def call(i: int) -> bool:
            async with session.post("/v1/classify", json={"input": texts[(offset + i) % len(texts)]}) as r:
                body = await r.read()
                return r.status == 200 and b'"data"' in body
        return await closed_loop([call] * concurrency, requests, duration, warmup, ready)


async def _httpx_level(url, texts, concurrency, requests, duration, warmup, offset, ready):
    """One client (httpx.AsyncClient, one keep-alive connection) per worker: one pool shared by
    many workers costs the client far more per call (measured with httpx 0.29 against the canned
    server: 230 calls/s at 64 workers on one pool, 1,500 with a client each)."""
    import httpx
    one = httpx.Limits(max_connections=1, max_keepalive_connections=1)
    clients = [httpx.AsyncClient(base_url=url, limits=one, timeout=120.0) for _ in range(concurrency)]

    def caller(client):
        async def call(i: int) -> bool:
            r = await client.post("/v1/classify", json={"input": texts[(offset + i) % len(texts)]})
            return r.status_code == 200 and b'"data"' in r.content
        return call
    try:
        return await closed_loop([caller(c) for c in clients], requests, duration, warmup, ready)
    finally:
        await asyncio.gather(*(c.aclose() for c in clients))


def _client_process(url, texts, concurrency, requests, duration, warmup, offset, barrier, results, client) -> None:
    """One client process of a level (multiprocessing target): its share of the workers."""
    lat, wall, errors = asyncio.run(http_level(url, texts, concurrency, requests, duration, warmup, offset,
                                               ready=barrier.wait, client=client))
    results.put((lat, wall, errors))


def run_http(url: str, texts: list[str], concurrency: int, requests: int, duration: float | None, warmup: int,
             procs: int, client: str) -> dict:
    """One level through HTTP: the workers (and the calls) split over min(procs, concurrency)
    client processes that start timing together; the wall time is the slowest process's."""
    procs = max(1, min(procs, concurrency))
    if procs == 1:
        return summary(*asyncio.run(http_level(url, texts, concurrency, requests, duration, warmup, 0, None, client)))
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(procs), ctx.Queue()
    shares = [concurrency // procs + (k < concurrency % procs) for k in range(procs)]
    workers = [ctx.Process(target=_client_process,
                           args=(url, texts, c, requests * c // concurrency, duration, max(c, warmup * c // concurrency),
                                 k * len(texts) // procs, barrier, results, client)) for k, c in enumerate(shares)]
    for w in workers:
        w.start()
    got = [results.get(timeout=600) for _ in workers]
    for w in workers:
        w.join()
    return summary([x for lat, _, _ in got for x in lat], max(w for _, w, _ in got), sum(e for _, _, e in got))


def run_in_process(engine, batcher_args: dict, texts: list[str], concurrency: int, requests: int,
                   duration: float | None, warmup: int, top_k: int = 3) -> dict:
    """One level with the engine in this process: the service's Batcher, C tasks each tokenizing
    one text and awaiting its answer, as the service's handler does without HTTP."""
    from vsr.runtime.batcher import Batcher

    async def go():
        batcher = Batcher(engine, **batcher_args)
        await batcher.start()

        async def call(i: int) -> bool:
            ids, problems = engine.tokenizer.encode_each([texts[i % len(texts)]])
            if problems[0] is not None:
                return False
            answered = await batcher.submit(ids, top_k)
            return len(answered.results) == 1
        try:
            return await closed_loop([call] * concurrency, requests, duration, warmup)
        finally:
            await batcher.close()
    return summary(*asyncio.run(go()))


# ---- the servers -----------------------------------------------------------------------------

def canned_body(labels: int) -> bytes:
    """A classify answer's size and shape for `labels` labels (what the canned server sends)."""
    data = [{"index": 0, "label": "HassTurnOn", "probs": [0.0123456789012345] * labels, "num_classes": labels,
             "top": [["HassTurnOn", 0.9269581437110901]] * 3}]
    return json.dumps({"id": "classify-" + "0" * 32, "object": "list", "created": 0, "model": ROUTER,
                       "mode": "triton", "data": data, "usage": {"prompt_tokens": 9, "total_tokens": 9}}).encode()


class _Canned(asyncio.Protocol):
    """HTTP/1.1 keep-alive: each request (headers, then Content-Length bytes) gets the one answer."""

    def __init__(self, response: bytes):
        self.response, self.buf = response, b""

    def connection_made(self, transport):
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while True:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            length = 0
            for line in self.buf[:end].split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            if len(self.buf) < end + 4 + length:
                return
            self.buf = self.buf[end + 4 + length:]
            self.transport.write(self.response)


def canned_server(port: int, body: bytes) -> None:
    """Serve the canned answer on 127.0.0.1:port until terminated (multiprocessing target)."""
    response = (b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: " + str(len(body)).encode()
                + b"\r\n\r\n" + body)

    async def main():
        server = await asyncio.get_running_loop().create_server(lambda: _Canned(response), "127.0.0.1", port)
        async with server:
            await server.serve_forever()
    asyncio.run(main())


def wait_ready(url: str, exited, timeout: float, path: str = "/health") -> None:
    """Poll url+path until it answers 200; `exited()` says why the server is gone (None while it runs)."""
    import httpx
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        why = exited()
        if why is not None:
            raise RuntimeError(f"the server exited before it was ready: {why}")
        try:
            if httpx.get(url + path, timeout=2.0).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"the server at {url} was not ready in {timeout} s")


def start_service(cfg: dict, log_path: Path, timeout: float = 600.0):
    """The service in its own process on a free port (run_service, the function `vsr-run serve`
    calls), its stderr in log_path: (process, url) once /health says ready."""
    cfg = dict(cfg, host="127.0.0.1", port=free_port())
    log = open(log_path, "w")
    proc = subprocess.Popen([sys.executable, "-c", LAUNCH, json.dumps(cfg)], stdout=subprocess.DEVNULL, stderr=log)
    log.close()
    url = f"http://127.0.0.1:{cfg['port']}"

    def exited():
        return None if proc.poll() is None else f"exit {proc.returncode}: {log_path.read_text()[-3000:]}"
    try:
        wait_ready(url, exited, timeout)
    except BaseException:
        proc.kill()
        raise
    return proc, url


def stop_service(proc) -> int:
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()


# ---- the record ------------------------------------------------------------------------------

def targets(rows: list[dict], kind: str) -> list[dict]:
    """Issue 40's targets at concurrency 64: on the H200 (a CUDA device) each met or missed; on
    the CPU the same figures with met None (the targets are the H200's)."""
    def row(provider):
        return next((r for r in rows if r["provider"] == provider and r["concurrency"] == TARGET_AT), None)
    http, local = row("http"), row("in-process")
    overhead = (round(1 - http["req_per_s"] / local["req_per_s"], 3)
                if http and local and local["req_per_s"] > 0 else None)
    out = [("http requests/s at concurrency 64", ">=", TARGET_RPS, http and http["req_per_s"]),
           ("http p99 ms at concurrency 64", "<=", TARGET_P99_MS, http and http["p99_ms"]),
           ("http + batching overhead vs in-process at concurrency 64", "<=", TARGET_OVERHEAD, overhead)]
    res = []
    for what, op, limit, value in out:
        met = None
        if kind == "cuda" and value is not None:
            met = value >= limit if op == ">=" else value <= limit
        res.append({"target": what, "op": op, "limit": limit, "value": value, "met": met})
    return res


def table(rows: list[dict]) -> str:
    head = f"{'provider':<11} {'conc':>5} {'req/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'errors':>6} {'client ceiling':>15}"
    lines = [head, "-" * len(head)]
    for r in rows:
        ceil = r.get("client_ceiling_req_per_s")
        mark = " (client-bound)" if r.get("client_bound") else ""
        lines.append(f"{r['provider']:<11} {r['concurrency']:>5} {r['req_per_s']:>9.1f} {r['p50_ms']:>8.2f} "
                     f"{r['p99_ms']:>8.2f} {r['errors']:>6} {'' if ceil is None else f'{ceil:.1f}':>15}{mark}")
    return "\n".join(lines)


def client_version(client: str) -> str:
    from importlib import metadata
    return f"{client} {metadata.version(client)}"


def importable(name: str) -> bool:
    import importlib.util
    return importlib.util.find_spec(name) is not None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default=None, help="cpu or cuda (default: cuda if present)")
    ap.add_argument("--package", default=ROUTER)
    ap.add_argument("--allow-unverified", action="store_true", help="a package folder without a manifest")
    ap.add_argument("--autotune-cache", default=None)
    ap.add_argument("--concurrency", default="1,8,64,256", help="comma-separated levels")
    ap.add_argument("--requests", type=int, default=2000, help="timed calls per level and provider")
    ap.add_argument("--duration", type=float, default=None, help="seconds per level (in place of --requests)")
    ap.add_argument("--warmup", type=int, default=None, help="untimed calls before each level (default: "
                                                            "max(4 x concurrency, requests / 10))")
    ap.add_argument("--max-batch", type=int, default=64)
    ap.add_argument("--max-wait-ms", type=float, default=2.0)
    ap.add_argument("--merge", choices=["exact", "shared"], default="shared")
    ap.add_argument("--replicas", type=int, default=1, help="the service's engine processes")
    ap.add_argument("--http-workers", type=int, default=None,
                    help="the service's HTTP worker processes (default: vsr-run serve's for --replicas)")
    ap.add_argument("--client-procs", type=int, default=1, help="client processes sharing each level's workers")
    ap.add_argument("--client", choices=["aiohttp", "httpx"], default=None,
                    help="the HTTP client library (default: aiohttp where installed, else httpx)")
    ap.add_argument("--texts", type=int, default=4096, help="distinct held-out sentences the calls cycle through")
    ap.add_argument("--texts-file", default=None, help='JSONL {"text": ...} lines to send in place of the split '
                                                      "(for a machine without the intents' sources)")
    ap.add_argument("--write-texts", default=None, metavar="FILE",
                    help="write the --texts held-out sentences to FILE (JSONL) and exit")
    ap.add_argument("--skip-in-process", action="store_true")
    ap.add_argument("--out", default=None, help="the result file, or a folder for serve-<device>-<date>.json")
    args = ap.parse_args(argv)
    if args.client is None:
        args.client = "aiohttp" if importable("aiohttp") else "httpx"

    if args.write_texts:
        Path(args.write_texts).write_text("".join(json.dumps({"text": t}) + "\n" for t in held_out_texts(args.texts)))
        print(f"wrote {args.texts} held-out sentences to {args.write_texts}")
        return 0
    load_before = os.getloadavg()
    import torch
    import triton

    from common_bench import code_commit, result_path
    from vsr.runtime.device import cpu_model
    from vsr.runtime.load import open_engine

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    kind = torch.device(device).type
    levels = [int(c) for c in args.concurrency.split(",")]
    texts = read_texts(args.texts_file) if args.texts_file else held_out_texts(args.texts)
    engine_args = dict(device=device, allow_unverified=args.allow_unverified, autotune_cache=args.autotune_cache)
    batcher_args = dict(max_batch=args.max_batch, max_wait_ms=args.max_wait_ms, max_queue=max(1024, 2 * max(levels)),
                        merge=args.merge)

    def warm(c: int) -> int:
        return args.warmup if args.warmup is not None else max(4 * c, args.requests // 10)

    common = {"device": device, "package": args.package, "max_batch": args.max_batch,
              "max_wait_ms": args.max_wait_ms, "merge": args.merge}
    pkg, engine = open_engine(args.package, **engine_args)   # builds a built-in package on first use
    # The loaded heap out of the cyclic collector's reach, as the service puts its own (after its
    # warm-up call), so the in-process figures are the same engine's.
    from vsr.runtime.service import freeze_heap
    freeze_heap()
    device_name = torch.cuda.get_device_name(torch.device(device)) if kind == "cuda" else f"cpu ({cpu_model()})"
    from vsr.runtime.service import default_http_workers
    http_workers = args.http_workers or default_http_workers(args.replicas)
    cfg = {"package": args.package, "device": device, "allow_unverified": args.allow_unverified,
           "autotune_cache": args.autotune_cache, "replicas": args.replicas, "http_workers": http_workers,
           **batcher_args}
    log_path = Path(tempfile.mkdtemp(prefix="bench-serve-")) / "service.log"
    proc, url = start_service(cfg, log_path)
    # The client's own ceiling: the same clients against the canned server, at each level.
    port = free_port()
    canned = multiprocessing.get_context("spawn").Process(
        target=canned_server, args=(port, canned_body(len(engine.labels or []))), daemon=True)
    canned.start()
    canned_url = f"http://127.0.0.1:{port}"
    # Level by level, the three side by side (a machine whose load drifts moves them together).
    rows = []
    try:
        wait_ready(canned_url, lambda: None if canned.is_alive() else f"exit {canned.exitcode}", 60, path="/")
        for c in levels:
            if not args.skip_in_process:
                r = {**common, "concurrency": c, "provider": "in-process", "replicas": 1,
                     **run_in_process(engine, batcher_args, texts, c, args.requests, args.duration, warm(c))}
                rows.append(r)
                print(json.dumps(r), flush=True)
            r = {**common, "concurrency": c, "provider": "http", "replicas": args.replicas,
                 "http_workers": http_workers,
                 **run_http(url, texts, c, args.requests, args.duration, warm(c), args.client_procs, args.client)}
            ceiling = run_http(canned_url, texts, c, args.requests, args.duration, warm(c), args.client_procs,
                               args.client)
            r["client_ceiling_req_per_s"] = ceiling["req_per_s"]
            r["client_bound"] = r["req_per_s"] >= CLIENT_BOUND * ceiling["req_per_s"]
            rows.append(r)
            print(json.dumps(r), flush=True)
    finally:
        canned.terminate()
        canned.join()
        code = stop_service(proc)
        gc.unfreeze()   # as the service at its stop: the process's exit then collects as usual
    if code != 0:
        raise RuntimeError(f"the service exited {code} on SIGTERM: {log_path.read_text()[-3000:]}")
    rows.sort(key=lambda r: (r["provider"] != "http", r["concurrency"]))

    record = {
        "benchmark": "serve", "device": device_name, "torch": torch.__version__, "triton": triton.__version__,
        "commit": code_commit(), "python": platform.python_version(), "cpu_count": os.cpu_count(),
        "package": pkg.name, "package_formats": sorted(pkg.formats), "requests": args.requests,
        "duration_s": args.duration, "max_batch": args.max_batch, "max_wait_ms": args.max_wait_ms,
        "merge": args.merge, "replicas": args.replicas, "http_workers": http_workers, "client_procs": args.client_procs,
        "client": client_version(args.client), "texts": len(texts),
        "texts_source": Path(args.texts_file).name if args.texts_file else "the intents' test split",
        "loadavg_1m": {"before": round(load_before[0], 2), "after": round(os.getloadavg()[0], 2)},
        "server": {"loop": "uvloop" if importable("uvloop") else "asyncio",
                   "http": "httptools" if importable("httptools") else "h11"},
        "rows": rows, "targets": targets(rows, kind),
    }
    out = Path(args.out) if args.out else None
    if out is None or out.is_dir() or args.out.endswith("/"):
        out = result_path("serve", "cpu" if kind == "cpu" else device_name, out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    for t in record["targets"]:
        state = "n/a (an H200 target)" if t["met"] is None else ("met" if t["met"] else "MISSED")
        print(f"target {t['target']}: {t['value']} ({t['op']} {t['limit']}): {state}")
    print(f"wrote {out}")
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
