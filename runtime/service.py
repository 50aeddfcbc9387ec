"""`vsr-run serve`: a router package as an HTTP service (Starlette on uvicorn), docs/serve.md.

Endpoints: POST /v1/classify (vLLM's classify response plus "top"), POST /v1/embeddings (the
OpenAI embeddings shape, for packages without a head), GET /v1/models, GET /health (200 once the
engine has answered a warm-up call), GET /metrics (Prometheus). Calls are merged by
vsr.runtime.batcher.Batcher, whose one worker thread runs the engine.

Errors, each as {"error": {"message", "type", "code"}} (OpenAI's error shape): 400 malformed JSON
or fields; 404 a "model" this service does not serve; 413 a body over max_body_bytes or a call
over max_batch inputs; 422 an empty or over-long text, with "index" (no input of that call is
answered); 503 a full queue (Retry-After) or a service still loading or draining; 500 an engine
failure, for the calls of that engine call only.

Replicas and HTTP workers (`--replicas N --http-workers W`, either above 1): N engine processes
(vsr.runtime.engine_server; replica i on GPU i % GPUs, or on the CPU, loading tiles from the one
autotune cache) behind W uvicorn worker processes on the one port, each worker building its app
through app_from_env and handing its calls' token ids to the engines.
"""
from __future__ import annotations

import base64
import contextlib
import gc
import json
import os
import struct
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from vsr.runtime.batcher import Batcher, Closed, QueueFull

CONFIG_ENV = "VSR_SERVE_CONFIG"   # the ServeConfig (JSON) each HTTP worker process reads
# What run_service hands a split service's HTTP workers (JSON): the engines' sockets and what its
# checks found in the package, so a worker neither opens the package again nor touches the GPU.
WORKER_ENV = "VSR_SERVE_WORKER"
WARMUP_TEXT = "turn on the kitchen lights"


@dataclass
class ServeConfig:
    package: str = "vsr/intent-minilm"
    host: str = "127.0.0.1"
    port: int = 8000
    revision: str | None = None
    dtype: str = "auto"
    device: str | None = None
    autotune_cache: str | None = None
    miss_policy: str = "default"
    allow_unverified: bool = False
    emulate: bool = False
    cuda_graphs: bool | None = None   # None: on for a CUDA device
    replicas: int = 1
    max_batch: int = 64
    max_wait_ms: float = 2.0
    max_queue: int = 1024
    merge: str = "exact"
    max_body_bytes: int = 1 << 20
    top_k: int = 3
    served_name: str | None = None   # the "model" name callers use (default: the package's name)
    graceful_timeout_s: float = 30.0
    http_workers: int = 1            # uvicorn worker processes (HTTP, JSON, tokenizing) on the port


class HTTPFailure(Exception):
    def __init__(self, status: int, kind: str, message: str, *, index: int | None = None, headers=None):
        super().__init__(message)
        self.status, self.kind, self.index, self.headers = status, kind, index, headers or {}


def _error_response(err: HTTPFailure):
    body = {"error": {"message": str(err), "type": err.kind, "code": err.status}}
    if err.index is not None:
        body["error"]["index"] = err.index
    return JSONResponse(body, status_code=err.status, headers=err.headers)


async def _read_json(request, limit: int) -> dict:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise HTTPFailure(413, "too_large", f"the body has {declared} bytes; this service takes at most {limit}")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise HTTPFailure(413, "too_large", f"the body is over {limit} bytes")
        chunks.append(chunk)
    try:
        obj = json.loads(b"".join(chunks))
    except UnicodeDecodeError as e:
        raise HTTPFailure(400, "bad_request", f"the body is not UTF-8 text ({e.reason})") from None
    except json.JSONDecodeError as e:
        raise HTTPFailure(400, "bad_request", f"malformed JSON: {e.msg} at line {e.lineno}, column {e.colno}") from None
    if not isinstance(obj, dict):
        raise HTTPFailure(400, "bad_request", "the body must be a JSON object")
    return obj


def _inputs(obj: dict, max_batch: int) -> list[str]:
    if "input" not in obj:
        raise HTTPFailure(400, "bad_request", 'missing field "input" (a text or a list of texts)')
    texts = obj["input"]
    if isinstance(texts, str):
        texts = [texts]
    if not isinstance(texts, list) or not texts:
        raise HTTPFailure(400, "bad_request", '"input" must be a text or a non-empty list of texts')
    for i, t in enumerate(texts):
        if not isinstance(t, str):
            raise HTTPFailure(400, "bad_request", f'"input"[{i}] must be a string, got {type(t).__name__}',
                              index=i)
    if len(texts) > max_batch:
        raise HTTPFailure(413, "too_large", f"the call has {len(texts)} inputs; this service takes at most "
                                            f"{max_batch} per call (--max-batch)")
    return texts


def freeze_heap() -> None:
    """Exempt every object alive now from Python's cyclic collector (gc.freeze), after a last
    collection: the modules, the model, its compiled kernels and graphs, which live as long as the
    process. Otherwise each full collection a busy service triggers walks all of them while every
    call waits. vLLM's engine freezes its heap once it has loaded, for the same reason. A process
    holds one service: stop() thaws the whole heap."""
    gc.collect()
    gc.freeze()


class Service:
    """The engine, its batcher and metrics, and what the endpoints say about them."""

    def __init__(self, engine, pkg, cfg: ServeConfig, *, replica: int | str | None = None,
                 device: str | None = None, batcher=None, results: bool = True):
        """`batcher`: in place of a Batcher over `engine` (a split service's worker passes
        engine_server.RemoteBatcher); `results` False: the batcher answers output rows only
        (an engine process, whose workers pick the top labels)."""
        from vsr.runtime.service_metrics import ServiceMetrics
        self.engine, self.pkg, self.cfg, self.replica = engine, pkg, cfg, replica
        self._device = device
        self.name = cfg.served_name or pkg.name
        self.metrics = ServiceMetrics()
        self.batcher = batcher or Batcher(engine, max_batch=cfg.max_batch, max_wait_ms=cfg.max_wait_ms,
                                          max_queue=cfg.max_queue, merge=cfg.merge, metrics=self.metrics,
                                          results=results)
        self.state = "loading"   # -> "ready" after the warm-up answer -> "draining" at shutdown

    @property
    def task(self) -> str:
        return "classify" if self.engine.labels is not None else "embed"

    @property
    def device(self) -> str:
        return self._device or str(self.engine.device)

    @property
    def ready(self) -> bool:
        return self.state == "ready" and getattr(self.batcher, "available", True)

    async def start(self) -> None:
        await self.batcher.start()   # (a RemoteBatcher connects to its engines here)
        ids, problems = self.engine.tokenizer.encode_each([WARMUP_TEXT])
        if problems[0] is not None:
            raise RuntimeError(f"the warm-up text cannot be answered: {problems[0]}")
        await self.batcher.submit(ids, 1)
        freeze_heap()
        self.state = "ready"

    async def stop(self) -> None:
        self.state = "draining"
        await self.batcher.close()
        gc.unfreeze()

    def model_card(self) -> dict:
        pkg = self.pkg
        return {"id": self.name, "object": "model", "created": int(time.time()), "owned_by": "vsr",
                "package": pkg.name, "revision": pkg.revision, "identity": pkg.identity_status,
                "formats": sorted(pkg.formats), "mode": self.engine.mode,
                "dtype": str(self.engine.act_dtype).removeprefix("torch."), "device": self.device,
                "support": pkg.support, "task": self.task, "labels": self.engine.labels,
                "max_tokens": self.engine.tokenizer.limit, "merge": self.cfg.merge, "max_batch": self.cfg.max_batch}

    async def answer(self, request, endpoint: str) -> tuple[dict, int | str | None]:
        """The call's response body, and the replica that answered it (None: this process's)."""
        obj = await _read_json(request, self.cfg.max_body_bytes)
        model = obj.get("model")
        if model is not None and model not in (self.name, self.pkg.name):
            raise HTTPFailure(404, "model_not_found", f"model {model!r} is not served here (this service serves "
                                                      f"{self.name!r})")
        want = "classify" if endpoint == "/v1/classify" else "embed"
        if want != self.task:
            other = "/v1/classify" if self.task == "classify" else "/v1/embeddings"
            raise HTTPFailure(400, "bad_request", f"{self.name} is a {'classifier' if self.task == 'classify' else 'package without a head'}"
                                                  f": use {other}")
        top_k = obj.get("top_k", self.cfg.top_k)
        if not isinstance(top_k, int) or isinstance(top_k, bool) or top_k < 1:
            raise HTTPFailure(400, "bad_request", '"top_k" must be a positive integer')
        fmt = obj.get("encoding_format", "float")
        if want == "embed" and fmt not in ("float", "base64"):
            raise HTTPFailure(400, "bad_request", '"encoding_format" must be "float" or "base64"')
        texts = _inputs(obj, self.cfg.max_batch)
        if self.state != "ready":
            raise HTTPFailure(503, "unavailable", f"the service is {self.state}", headers={"Retry-After": "1"})
        ids, problems = self.engine.tokenizer.encode_each(texts)
        bad = [(i, p) for i, p in enumerate(problems) if p is not None]
        if bad:
            i, p = bad[0]
            more = f" (and {len(bad) - 1} more inputs)" if len(bad) > 1 else ""
            raise HTTPFailure(422, "invalid_input", f"input {i}: {p}{more}; no input of this call was answered",
                              index=i)
        try:
            answered = await self.batcher.submit(ids, top_k)
        except QueueFull as e:
            raise HTTPFailure(503, "queue_full", f"the queue is full ({e}); retry later",
                              headers={"Retry-After": "1"}) from None
        except Closed as e:
            raise HTTPFailure(503, "unavailable", str(e), headers={"Retry-After": "1", "Connection": "close"}) from None
        except Exception as e:   # the engine failed on this call's batch: this call's answer only
            raise HTTPFailure(500, "engine_error", f"the engine failed on this call's batch: "
                                                   f"{type(e).__name__}: {e}") from None
        self.metrics.inputs.inc(len(texts))
        tokens = sum(len(x) for x in ids)
        usage = {"prompt_tokens": tokens, "total_tokens": tokens}
        if want == "classify":
            # One tolist for the call's rows: iterating the tensor builds a view per row on the event loop.
            data = [{"index": i, "label": r["choice"], "probs": row, "num_classes": len(self.engine.labels),
                     "top": r["top"]} for i, (row, r) in enumerate(zip(answered.rows(), answered.results))]
            return ({"id": f"classify-{uuid.uuid4().hex}", "object": "list", "created": int(time.time()),
                     "model": self.name, "mode": self.engine.mode, "data": data, "usage": usage}, answered.replica)
        data = []
        for i, vec in enumerate(answered.rows()):
            emb = base64.b64encode(struct.pack(f"<{len(vec)}f", *vec)).decode() if fmt == "base64" else vec
            data.append({"object": "embedding", "index": i, "embedding": emb})
        return ({"object": "list", "model": self.name, "mode": self.engine.mode, "data": data, "usage": usage},
                answered.replica)


def create_app(service: Service):
    """The Starlette app of one service; its lifespan runs the warm-up and, at shutdown, the drain.
    Plain Starlette routes: FastAPI adds per-call dependency solving and telemetry checks (cookies
    and query parsed, the environment read) on the event loop, which endpoints that read their body
    themselves do not use."""
    @contextlib.asynccontextmanager
    async def lifespan(app):
        await service.start()
        try:
            yield
        finally:
            await service.stop()

    m = service.metrics
    replica_header = {} if service.replica is None else {"x-vsr-replica": str(service.replica)}

    async def handle(request: Request, endpoint: str):
        t0 = time.perf_counter()
        try:
            body, replica = await service.answer(request, endpoint)
            resp = JSONResponse(body, headers=replica_header if replica is None else {"x-vsr-replica": str(replica)})
        except HTTPFailure as err:
            m.errors.labels(err.kind).inc()
            resp = _error_response(err)
            resp.headers.update(replica_header)
        m.requests.labels(endpoint, str(resp.status_code)).inc()
        m.latency.labels(endpoint).observe(time.perf_counter() - t0)
        return resp

    async def classify(request: Request):
        return await handle(request, "/v1/classify")

    async def embeddings(request: Request):
        return await handle(request, "/v1/embeddings")

    async def models(request: Request):
        m.requests.labels("/v1/models", "200").inc()
        return JSONResponse({"object": "list", "data": [service.model_card()]}, headers=replica_header)

    async def health(request: Request):
        ready = service.ready
        m.requests.labels("/health", "200" if ready else "503").inc()
        return JSONResponse({"status": service.state, "model": service.name, "mode": service.engine.mode,
                             "queue_depth": service.batcher.depth}, status_code=200 if ready else 503,
                            headers=replica_header)

    async def metrics(request: Request):
        body, ctype = m.exposition()
        return Response(body, media_type=ctype)

    async def not_found(request, exc):
        m.errors.labels("not_found").inc()
        return _error_response(HTTPFailure(404, "not_found", f"no endpoint {request.method} {request.url.path}"))

    async def not_allowed(request, exc):
        m.errors.labels("method_not_allowed").inc()
        return _error_response(HTTPFailure(405, "method_not_allowed", f"{request.method} is not allowed on "
                                                                      f"{request.url.path}",
                                           headers=dict(getattr(exc, "headers", None) or {})))

    routes = [Route("/v1/classify", classify, methods=["POST"]), Route("/v1/embeddings", embeddings, methods=["POST"]),
              Route("/v1/models", models, methods=["GET"]), Route("/health", health, methods=["GET"]),
              Route("/metrics", metrics, methods=["GET"])]
    return Starlette(routes=routes, lifespan=lifespan, exception_handlers={404: not_found, 405: not_allowed})


# ---- starting the service --------------------------------------------------------------------

def resolve_device(device: str | None) -> str:
    import torch
    return device or ("cuda" if torch.cuda.is_available() else "cpu")


def build_service(cfg: ServeConfig, *, replica: int | str | None = None, device: str | None = None,
                  results: bool = True) -> Service:
    """Open the package with every check vsr-run makes and load its engine (vsr.runtime.load)."""
    from vsr.runtime.load import open_engine
    dev = device or resolve_device(cfg.device)
    pkg, engine = open_engine(cfg.package, device=dev, revision=cfg.revision, allow_unverified=cfg.allow_unverified,
                              dtype=cfg.dtype, emulate=cfg.emulate, autotune_cache=cfg.autotune_cache,
                              miss_policy=cfg.miss_policy, cuda_graphs=cfg.cuda_graphs)
    return Service(engine, pkg, cfg, replica=replica, device=dev, results=results)


def default_http_workers(replicas: int) -> int:
    """One HTTP worker with one replica (a single process); else two per replica, at most one per CPU."""
    return 1 if replicas <= 1 else max(1, min(2 * replicas, os.cpu_count() or 1))


def replica_device(cfg: ServeConfig, slot: int) -> str:
    """Replica `slot`'s device: GPU slot % the GPUs of this host when the device is CUDA (two
    replicas may share one GPU), else the configured device."""
    import torch
    dev = resolve_device(cfg.device)
    if torch.device(dev).type != "cuda" or torch.device(dev).index is not None:
        return dev
    return f"cuda:{slot % torch.cuda.device_count()}"


def app_from_env():
    """uvicorn's app factory for a worker process of a split service: the ServeConfig from
    VSR_SERVE_CONFIG, the package's tokenizer, and the engine processes' sockets."""
    from types import SimpleNamespace

    from vsr.runtime.engine_server import RemoteBatcher, RemoteEngine
    from vsr.runtime.tokenize import PackageTokenizer
    cfg = ServeConfig(**json.loads(os.environ[CONFIG_ENV]))
    worker = json.loads(os.environ[WORKER_ENV])
    card = worker["package"]
    pkg = SimpleNamespace(**{**card, "formats": set(card["formats"])})
    engine = RemoteEngine(PackageTokenizer(card["path"], card["config"]))
    batcher = RemoteBatcher(worker["sockets"], engine, max_batch=cfg.max_batch)
    return create_app(Service(engine, pkg, cfg, batcher=batcher))


def _stop_quietly_after_drain() -> None:
    """uvicorn's server catches SIGTERM/SIGINT, drains, restores the handlers it found and raises
    the signal again; with these handlers that signal ends nothing, so a drained service exits 0."""
    import signal
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: None)


def run_service(cfg: ServeConfig, log=print) -> None:
    """Check and load, then serve until SIGTERM/SIGINT (uvicorn's graceful shutdown: stop
    accepting, answer what was accepted, exit). One replica with one HTTP worker loads its engine
    here, before the port opens. Otherwise this process opens the package (every check, no
    weights), starts the engine processes and waits until each has answered its warm-up call, then
    opens the port with the HTTP workers; once they have drained, the engines stop."""
    import tempfile

    import uvicorn
    # No access log and no proxy-header rewriting: both run on the event loop for every call, and
    # nothing here reads the client's address (errors and metrics are the service's own).
    common = dict(host=cfg.host, port=cfg.port, log_level="warning", access_log=False, proxy_headers=False,
                  timeout_graceful_shutdown=cfg.graceful_timeout_s)
    if cfg.replicas <= 1 and cfg.http_workers <= 1:
        service = build_service(cfg)
        log(f"vsr-run serve: {service.pkg.name} revision {service.pkg.revision or '-'} "
            f"(identity {service.pkg.identity_status}); formats {', '.join(sorted(service.pkg.formats))}; "
            f"device {service.device}: {service.pkg.support}; mode {service.engine.mode}; "
            f"http://{cfg.host}:{cfg.port}")
        _stop_quietly_after_drain()
        uvicorn.run(create_app(service), **common)
        return
    from vsr.runtime.engine_server import EngineProcesses
    from vsr.runtime.package import open_package
    dev = resolve_device(cfg.device)
    pkg = open_package(cfg.package, revision=cfg.revision, allow_unverified=cfg.allow_unverified, device=dev,
                       emulate=cfg.emulate)
    # Private to this user: the engines' sockets take pickled frames from whoever can connect.
    with tempfile.TemporaryDirectory(prefix="vsr-serve-") as tmp:
        os.makedirs(Path(tmp) / "metrics")
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(Path(tmp) / "metrics")   # before any process starts
        engines = EngineProcesses(json.dumps(asdict(cfg)), cfg.replicas, Path(tmp), log=log)
        log(f"vsr-run serve: {pkg.name} revision {pkg.revision or '-'} (identity {pkg.identity_status}); "
            f"loading {cfg.replicas} engine process(es) on {dev}")
        cards = engines.start()
        try:
            os.environ[CONFIG_ENV] = json.dumps(asdict(cfg))
            os.environ[WORKER_ENV] = json.dumps({"sockets": engines.paths, "package": {
                "name": pkg.name, "revision": pkg.revision, "identity_status": pkg.identity_status,
                "formats": sorted(pkg.formats), "support": pkg.support, "path": str(pkg.path), "config": pkg.config}})
            log(f"vsr-run serve: mode {cards[0]['mode']}; engines on {', '.join(c['device'] for c in cards)}; "
                f"{cfg.http_workers} HTTP worker(s); http://{cfg.host}:{cfg.port}")
            uvicorn.run("vsr.runtime.service:app_from_env", factory=True, workers=cfg.http_workers, **common)
        finally:
            engines.stop()
