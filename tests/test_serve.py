"""vsr-run serve against real uvicorn servers on free ports, with a real HTTP client (httpx).

One `python -m vsr.cli.run serve` process serves the module (the built-in router on the CPU);
the error classes that need a slow or failing engine run an in-process uvicorn server over a
wrapped engine; the drain and the replicas get processes of their own.
"""
import asyncio
import base64
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

from tinypkgs import CALIBRATION, TEST_TEXTS, minilm_dir  # noqa: E402
from vsr.runtime.batcher import answer_ids  # noqa: E402

ROUTER = "vsr/intent-minilm"
ROOMS = ["kitchen", "bedroom", "garage", "office", "hallway", "basement", "attic", "porch"]
TEXTS = CALIBRATION + TEST_TEXTS + [f"{v} the {r} {d}" for v in ("turn on", "switch off", "dim")
                                    for r in ROOMS for d in ("lights", "fan")]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(*args: str, timeout: float = 90.0):
    """A `vsr-run serve` process on a free port, once its /health says ready: (process, base url)."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "vsr.cli.run", "serve", "--device", "cpu", "--port", str(port),
                             *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"vsr-run serve exited {proc.returncode}: {proc.stderr.read()}")
        try:
            if httpx.get(url + "/health", timeout=1.0).status_code == 200:
                return proc, url
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise AssertionError(f"vsr-run serve did not become ready in {timeout} s")


def stop(proc) -> int:
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()


@pytest.fixture(scope="module")
def server():
    proc, url = start_server("--max-batch", "16", "--max-body-bytes", "8192")
    yield url
    assert stop(proc) == 0


@pytest.fixture(scope="module")
def engine():
    from vsr.runtime.load import open_engine
    return open_engine(ROUTER, device="cpu")[1]


def alone(engine, texts, top_k=3):
    """The answer `vsr-run --json` gives these texts alone: (probability rows, results)."""
    ids, problems = engine.tokenizer.encode_each(texts)
    assert not any(problems)
    a = answer_ids(engine, ids, top_k)
    return [row.tolist() for row in a.outputs], a.results


def metric(url: str, name: str) -> float:
    """The sum of every sample of `name` (all label sets) in /metrics."""
    total = 0.0
    for line in httpx.get(url + "/metrics").text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


async def post_all(url: str, bodies: list, path="/v1/classify"):
    async with httpx.AsyncClient(base_url=url, timeout=60.0, limits=httpx.Limits(max_connections=512)) as client:
        return await asyncio.gather(*(client.post(path, json=b) for b in bodies), return_exceptions=True)


# ---- the module's server ------------------------------------------------------------------

def test_models_and_health(server):
    h = httpx.get(server + "/health")
    assert h.status_code == 200 and h.json()["status"] == "ready"
    card = httpx.get(server + "/v1/models").json()["data"][0]
    assert card["id"] == ROUTER and card["mode"] == "reference" and card["dtype"] == "float32"
    assert card["formats"] == ["dense"] and card["identity"] == "verified" and card["revision"]
    assert card["task"] == "classify" and len(card["labels"]) > 10


def test_classify_is_the_cli_answer(server, engine):
    texts = ["turn on the kitchen lights", "what's the weather like tomorrow"]
    r = httpx.post(server + "/v1/classify", json={"model": ROUTER, "input": texts})
    assert r.status_code == 200
    body = r.json()
    assert body["object"] == "list" and body["model"] == ROUTER and body["id"].startswith("classify-")
    cli = subprocess.run([sys.executable, "-m", "vsr.cli.run", "--device", "cpu", "--json",
                          *[a for t in texts for a in ("--text", t)]], capture_output=True, text=True, check=True)
    lines = [json.loads(x) for x in cli.stdout.splitlines()]
    probs, _ = alone(engine, texts)
    tokens = sum(len(x) for x in engine.tokenizer.encode(texts))
    assert body["usage"] == {"prompt_tokens": tokens, "total_tokens": tokens}
    for i, (d, line) in enumerate(zip(body["data"], lines, strict=True)):
        assert d["index"] == i and d["label"] == line["choice"]
        assert d["top"] == line["top"]            # the CLI's floats, bit for bit (JSON floats round-trip)
        assert d["probs"] == probs[i] and d["num_classes"] == len(d["probs"])
        assert d["top"][0][1] == max(d["probs"])
    one = httpx.post(server + "/v1/classify", json={"input": texts[0], "top_k": 5}).json()["data"]
    assert len(one) == 1 and one[0]["top"] == alone(engine, texts[:1], top_k=5)[1][0]["top"]


def test_concurrent_calls_are_merged_and_each_gets_its_own_answer(server, engine):
    bodies = [{"input": [TEXTS[(7 * i + j) % len(TEXTS)] for j in range(1 + i % 3)]} for i in range(48)]
    calls_before, batches_before = metric(server, "vsr_batch_calls_sum"), metric(server, "vsr_batch_calls_count")
    responses = asyncio.run(post_all(server, bodies))
    for body, r in zip(bodies, responses, strict=True):
        assert r.status_code == 200, r.text
        probs, results = alone(engine, body["input"])
        got = r.json()["data"]
        assert [d["probs"] for d in got] == probs
        assert [d["top"] for d in got] == [x["top"] for x in results]
    calls = metric(server, "vsr_batch_calls_sum") - calls_before
    batches = metric(server, "vsr_batch_calls_count") - batches_before
    assert calls == 48 and batches < calls   # some worker batch took more than one call


@pytest.mark.parametrize("payload, status, kind, index", [
    (b'{"input": ["turn on', 400, "bad_request", None),
    (b'["turn on the lights"]', 400, "bad_request", None),
    (b'{"inputs": "turn on the lights"}', 400, "bad_request", None),
    (b'{"input": ["fine", 7]}', 400, "bad_request", 1),
    (b'{"input": []}', 400, "bad_request", None),
    (b'{"input": "x", "top_k": 0}', 400, "bad_request", None),
    (b'{"input": ["fine", "   ", "also fine"]}', 422, "invalid_input", 1),
    (json.dumps({"input": ["fine", "fine", "lights " * 1300]}).encode(), 413, "too_large", None),
    (json.dumps({"input": ["fine", "fine", "lights " * 600]}).encode(), 422, "invalid_input", 2),
    (json.dumps({"input": ["x"] * 17}).encode(), 413, "too_large", None),
    (b'{"model": "someone/else", "input": "x"}', 404, "model_not_found", None),
])
def test_bad_calls_get_their_status_and_nothing_half_answered(server, payload, status, kind, index):
    before = metric(server, "vsr_inputs_total")
    r = httpx.post(server + "/v1/classify", content=payload, headers={"content-type": "application/json"})
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["type"] == kind and err["code"] == status and err.get("index") == index
    if index is not None and status == 422:
        assert f"input {index}" in err["message"]
    assert metric(server, "vsr_inputs_total") == before   # no input of a refused call was answered
    assert httpx.get(server + "/health").status_code == 200


def test_wrong_endpoint_method_and_task(server):
    r = httpx.get(server + "/v2/nothing")
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found"
    r = httpx.get(server + "/v1/classify")
    assert r.status_code == 405 and r.json()["error"]["type"] == "method_not_allowed"
    assert "POST" in r.headers["allow"]
    r = httpx.post(server + "/v1/embeddings", json={"input": "x"})
    assert r.status_code == 400 and "/v1/classify" in r.json()["error"]["message"]


def test_metrics_counters_move(server):
    before_ok = metric(server, 'vsr_requests_total{code="200",endpoint="/v1/classify"}')
    before_err = metric(server, 'vsr_errors_total{kind="invalid_input"}')
    before_lat = metric(server, 'vsr_request_latency_seconds_count{endpoint="/v1/classify"}')
    before_rows = metric(server, "vsr_batch_rows_sum")
    httpx.post(server + "/v1/classify", json={"input": ["open the garage door", "pause the music"]})
    httpx.post(server + "/v1/classify", json={"input": [""]})
    text = httpx.get(server + "/metrics").text
    assert "vsr_queue_depth" in text and "vsr_engine_seconds_bucket" in text
    assert metric(server, 'vsr_requests_total{code="200",endpoint="/v1/classify"}') == before_ok + 1
    assert metric(server, 'vsr_errors_total{kind="invalid_input"}') == before_err + 1
    assert metric(server, 'vsr_request_latency_seconds_count{endpoint="/v1/classify"}') == before_lat + 2
    assert metric(server, "vsr_batch_rows_sum") == before_rows + 2


def test_checks_run_before_the_port_opens():
    port = free_port()
    r = subprocess.run([sys.executable, "-m", "vsr.cli.run", "serve", "--device", "cpu", "--port", str(port),
                        "--revision", "not-this-one"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 4 and "revision" in r.stderr
    assert "http://" not in r.stderr   # never got as far as serving


# ---- in-process servers over a wrapped engine --------------------------------------------

class WrappedEngine:
    """The real engine, slowed by `delay` seconds per engine call, raising on a token row equal to
    the one of `poison`."""

    def __init__(self, engine, *, delay=0.0, poison=None):
        self._engine, self._delay = engine, delay
        self._poison = engine.tokenizer.encode([poison])[0] if poison else None

    def __getattr__(self, name):
        return getattr(self._engine, name)

    def _forward_ids(self, ids):
        time.sleep(self._delay)
        if self._poison is not None and self._poison in ids:
            raise RuntimeError("injected engine failure")
        return self._engine._forward_ids(ids)


class InProcessServer:
    def __init__(self, service):
        import uvicorn

        from vsr.runtime.service import create_app
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(create_app(service), host="127.0.0.1", port=self.port,
                                                    log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self):
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            assert time.monotonic() < deadline and self.thread.is_alive(), "the in-process server did not start"
            time.sleep(0.05)
        return self

    def __exit__(self, *exc):
        self.server.should_exit = True
        self.thread.join(timeout=30)


def service_over(engine, pkg=None, **cfg):
    from vsr.runtime.service import ServeConfig, Service
    if pkg is None:
        from vsr.runtime.package import open_package
        pkg = open_package(ROUTER, device="cpu")
    return Service(engine, pkg, ServeConfig(**cfg))


def test_the_heap_is_frozen_once_ready_and_thawed_at_stop(engine):
    import gc
    with InProcessServer(service_over(engine)) as s:
        assert httpx.get(s.url + "/health").status_code == 200
        assert gc.get_freeze_count() > 0   # the loaded modules and model: out of the cyclic collector's walk
    assert gc.get_freeze_count() == 0


def test_full_queue_is_503_with_retry_after(engine):
    with InProcessServer(service_over(WrappedEngine(engine, delay=0.15), max_batch=1, max_queue=2)) as s:
        responses = asyncio.run(post_all(s.url, [{"input": TEXTS[i]} for i in range(10)]))
        codes = sorted(r.status_code for r in responses)
        assert 503 in codes and 200 in codes and set(codes) <= {200, 503}
        for r in responses:
            if r.status_code == 503:
                assert r.headers["retry-after"] == "1" and r.json()["error"]["type"] == "queue_full"
        assert metric(s.url, 'vsr_errors_total{kind="queue_full"}') == codes.count(503)
        assert httpx.post(s.url + "/v1/classify", json={"input": "pause the music"}).status_code == 200


def test_engine_error_fails_only_its_batch(engine):
    poison = "a text this wrapped engine fails on"
    with InProcessServer(service_over(WrappedEngine(engine, delay=0.01, poison=poison), max_batch=8)) as s:
        bodies = [{"input": [poison] if i % 5 == 0 else [TEXTS[i], TEXTS[i + 1]]} for i in range(20)]
        responses = asyncio.run(post_all(s.url, bodies))
        for body, r in zip(bodies, responses, strict=True):
            if body["input"] == [poison]:
                assert r.status_code == 500 and r.json()["error"]["type"] == "engine_error"
            else:
                assert r.status_code == 200, r.text
        assert metric(s.url, "vsr_engine_failures_total") == 4
        assert httpx.get(s.url + "/health").status_code == 200
    for body, r in zip(bodies, responses):   # the engine is free again: the answers alone
        if r.status_code == 200:
            assert [d["probs"] for d in r.json()["data"]] == alone(engine, body["input"])[0]


def test_shared_merging_agrees_with_the_answer_alone(engine):
    bodies = [{"input": [TEXTS[(3 * i) % len(TEXTS)]]} for i in range(32)]
    with InProcessServer(service_over(engine, max_batch=32, max_wait_ms=20, merge="shared")) as s:
        responses = asyncio.run(post_all(s.url, bodies))
        assert metric(s.url, "vsr_engine_call_rows_sum") > metric(s.url, "vsr_engine_call_rows_count")
    for body, r in zip(bodies, responses, strict=True):
        assert r.status_code == 200
        probs, results = alone(engine, body["input"])
        got = r.json()["data"][0]
        assert got["label"] == results[0]["choice"]
        assert max(abs(a - b) for a, b in zip(got["probs"], probs[0])) < 1e-5


def test_embeddings_for_a_package_without_a_head():
    from vsr.runtime.service import ServeConfig, build_service
    service = build_service(ServeConfig(package=str(minilm_dir()), allow_unverified=True, device="cpu"))
    texts = ["turn on the kitchen lights", "hello"]
    with InProcessServer(service) as s:
        assert httpx.get(s.url + "/v1/models").json()["data"][0]["task"] == "embed"
        r = httpx.post(s.url + "/v1/embeddings", json={"input": texts})
        b64 = httpx.post(s.url + "/v1/embeddings", json={"input": texts, "encoding_format": "base64"})
        wrong = httpx.post(s.url + "/v1/classify", json={"input": texts})
    assert r.status_code == 200 and wrong.status_code == 400
    body = r.json()
    assert body["object"] == "list" and [d["index"] for d in body["data"]] == [0, 1]
    want = alone(service.engine, texts)[0]
    assert [d["embedding"] for d in body["data"]] == want and all(d["object"] == "embedding" for d in body["data"])
    for d, w in zip(b64.json()["data"], want):
        raw = base64.b64decode(d["embedding"])
        assert list(struct.unpack(f"<{len(w)}f", raw)) == w


# ---- processes of their own ---------------------------------------------------------------

def _sigterm_under_load(bodies, args=(), warmups=1):
    """Start a server, send every call, SIGTERM once all are accepted: (exit status, how many calls
    were answered after the signal, the responses). `warmups`: the warm-up calls its engines answer."""
    proc, url = start_server("--max-batch", "4", *args)
    done = []

    async def drive():
        async with httpx.AsyncClient(base_url=url, timeout=60.0, limits=httpx.Limits(max_connections=200)) as client:
            async def one(b):
                r = await client.post("/v1/classify", json=b)
                done.append(time.monotonic())
                return r
            tasks = [asyncio.ensure_future(one(b)) for b in bodies]
            # Every call accepted (taken by the worker, less its warm-up call, or queued):
            while metric(url, "vsr_batch_calls_sum") - warmups + metric(url, "vsr_queue_depth") < len(bodies):
                await asyncio.sleep(0.02)
            sent_at = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            return sent_at, await asyncio.gather(*tasks, return_exceptions=True)

    sent_at, responses = asyncio.run(drive())
    return proc.wait(timeout=60), sum(t > sent_at for t in done), responses


@pytest.mark.parametrize("args,warmups", [((), 1), (("--http-workers", "2"), 3)], ids=["one-process", "split"])
def test_sigterm_answers_every_accepted_call_then_exits_0(engine, args, warmups):
    """In one process, and split (the HTTP workers drain before the engine process stops)."""
    bodies = [{"input": [TEXTS[(5 * i + j) % len(TEXTS)] for j in range(4)]} for i in range(96)]
    # The server may answer the last accepted calls before the signal lands (a race with the
    # client's polling): a run counts once calls were still waiting; a few runs make one likely.
    for _ in range(4):
        status, after, responses = _sigterm_under_load(bodies, args, warmups)
        assert status == 0
        for body, r in zip(bodies, responses, strict=True):
            assert not isinstance(r, Exception), r
            assert r.status_code == 200, r.text
            assert [d["probs"] for d in r.json()["data"]] == alone(engine, body["input"])[0]
        if after:
            break
    assert after > 0   # calls were still waiting when the signal came


def test_replicas_share_one_port(engine):
    proc, url = start_server("--replicas", "2", "--http-workers", "2", timeout=180)
    try:
        seen, answered = set(), 0
        for _ in range(20):
            bodies = [{"input": [TEXTS[i % len(TEXTS)]]} for i in range(16)]
            for body, r in zip(bodies, asyncio.run(post_all(url, bodies)), strict=True):
                assert r.status_code == 200
                assert r.json()["data"][0]["probs"] == alone(engine, body["input"])[0][0]
                seen.add(r.headers["x-vsr-replica"])
                answered += 1
            if seen == {"0", "1"}:
                break
        assert seen == {"0", "1"}
        card = httpx.get(url + "/v1/models").json()["data"][0]
        assert card["mode"] == "reference" and card["device"] == "cpu" and card["dtype"] == "float32"
        # every process's metrics, summed (prometheus-client's multiprocess mode); +4: the warm-ups
        # of the 2 engines and of the 2 HTTP workers (each answers one through an engine)
        assert metric(url, "vsr_batch_rows_sum") == answered + 4
        assert metric(url, "vsr_requests_total") >= answered
    finally:
        assert stop(proc) == 0


def _engine_process(root: int, slot: int = 0) -> int:
    """The pid of the process serving engine socket `slot` among root's children (Linux /proc: the
    process holding a socket bound to that path; the HTTP workers' ends of it have no path)."""
    with open("/proc/net/unix") as f:
        inodes = {f"socket:[{line.split()[6]}]" for line in f if line.rstrip().endswith(f"engine-{slot}.sock")}
    for d in os.listdir("/proc"):
        try:
            with open(f"/proc/{d}/stat") as f:
                if not d.isdigit() or int(f.read().rsplit(")", 1)[1].split()[1]) != root:
                    continue
            if any(os.readlink(f"/proc/{d}/fd/{fd}") in inodes for fd in os.listdir(f"/proc/{d}/fd")):
                return int(d)
        except OSError:
            continue
    raise AssertionError(f"no child of {root} serves engine socket {slot}")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="finds the engine process through /proc")
def test_http_workers_share_one_engine_and_survive_its_death(engine):
    """Two HTTP workers in front of one engine process: shared merging answers every call as the
    merged engine call would (within rounding) and top_k is each call's own; an engine process
    killed mid-service makes calls 503 (never a wrong answer), and the restarted engine answers."""
    proc, url = start_server("--http-workers", "2", "--merge", "shared", timeout=180)
    try:
        bodies = [{"input": [TEXTS[i % len(TEXTS)], TEXTS[(i + 7) % len(TEXTS)]], "top_k": 1 + i % 4}
                  for i in range(24)]
        for body, r in zip(bodies, asyncio.run(post_all(url, bodies)), strict=True):
            assert r.status_code == 200, r.text
            assert r.headers["x-vsr-replica"] == "0"
            want, results = alone(engine, body["input"], body["top_k"])
            for d, row, res in zip(r.json()["data"], want, results, strict=True):
                assert len(d["top"]) == body["top_k"] and d["label"] == res["choice"]
                assert max(abs(a - b) for a, b in zip(d["probs"], row, strict=True)) < 1e-5
        engine_pid = _engine_process(proc.pid)
        os.kill(engine_pid, signal.SIGKILL)
        codes = set()
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            r = httpx.post(url + "/v1/classify", json={"input": "turn on the kitchen lights"}, timeout=30)
            codes.add(r.status_code)
            if r.status_code == 200:
                break
            assert r.status_code == 503 and r.headers["retry-after"] == "1", r.text
            time.sleep(0.2)
        assert 503 in codes   # the calls between the engine's death and its restart
        assert r.status_code == 200 and r.json()["data"][0]["probs"] == alone(engine, ["turn on the kitchen lights"])[0][0]
    finally:
        assert stop(proc) == 0
