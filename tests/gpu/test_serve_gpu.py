"""On a GPU: `vsr-run serve --replicas 2` with both engine processes on the one GPU (issue 40,
point 5), called concurrently over HTTP (urllib, the standard library's client): every answer is
the bytes the same package's engine gives that call alone in this process, and both replicas
answer. The built-in router runs where it is built on this machine; VSR_GPU_TEST_PACKAGES
(package folders, comma-separated) names the packages to serve instead."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

PACKAGES = [p for p in os.environ.get("VSR_GPU_TEST_PACKAGES", "").split(",") if p] or ["vsr/intent-minilm"]
TEXTS = ["turn on the kitchen lights", "set a timer for ten minutes", "what's the weather like tomorrow",
         "dim the bedroom lamp to half", "is the garage door open", "play some jazz in the living room"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str):
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.status, json.loads(r.read())


def _classify(url: str, texts: list[str]):
    req = urllib.request.Request(url + "/v1/classify", data=json.dumps({"input": texts}).encode(),
                                 headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return r.headers["x-vsr-replica"], json.loads(r.read())


@pytest.mark.parametrize("pkg", PACKAGES)
def test_two_replicas_share_one_gpu_and_answer_as_the_engine_alone(pkg):
    from vsr.runtime import builtin
    from vsr.runtime.batcher import answer_ids
    from vsr.runtime.load import open_engine

    if pkg.startswith("vsr/") and not builtin.is_built(pkg):
        pytest.skip(f"{pkg} is not built on this machine (VSR_GPU_TEST_PACKAGES names package folders)")
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.Popen([sys.executable, "-m", "vsr.cli.run", "serve", pkg, "--device", "cuda", "--port",
                             str(port), "--replicas", "2", "--http-workers", "2"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        deadline = time.monotonic() + 600
        while True:
            assert proc.poll() is None, proc.stderr.read()[-3000:]
            try:
                if _get(url + "/health")[0] == 200:
                    break
            except (urllib.error.URLError, ConnectionError):
                pass
            assert time.monotonic() < deadline, "the service did not become ready"
            time.sleep(0.5)
        card = _get(url + "/v1/models")[1]["data"][0]
        assert card["device"] == "cuda:0" and card["mode"] == "triton"
        _, engine = open_engine(pkg, device="cuda")
        calls = [[TEXTS[(i + j) % len(TEXTS)] for j in range(1 + i % 3)] for i in range(48)]
        with ThreadPoolExecutor(16) as pool:
            answers = list(pool.map(lambda texts: _classify(url, texts), calls))
        assert {replica for replica, _ in answers} == {"0", "1"}
        for texts, (_, body) in zip(calls, answers, strict=True):
            ids, problems = engine.tokenizer.encode_each(texts)
            assert not any(problems)
            want = answer_ids(engine, ids, 3)
            assert [d["probs"] for d in body["data"]] == want.outputs.tolist()
            assert [d["top"] for d in body["data"]] == [r["top"] for r in want.results]
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            assert proc.wait(timeout=120) == 0, proc.stderr.read()[-3000:]
        finally:
            if proc.poll() is None:
                proc.kill()
