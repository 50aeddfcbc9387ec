"""The service as a Ray Serve deployment (vsr.runtime.ray_deployment): a local Ray instance, two CPU
replicas of the built-in router, calls through Ray Serve's own HTTP proxy with a real client."""
import asyncio
import contextlib
import subprocess
import sys

import pytest

pytest.importorskip("ray.serve", reason="Ray Serve is not installed (the ray extra: pip install 'vsr[ray]')")
httpx = pytest.importorskip("httpx")

import ray  # noqa: E402
from test_serve import TEXTS, alone, engine, free_port, post_all, start_server, stop  # noqa: E402,F401 (engine: a fixture)
from vsr.runtime import ray_deployment as rd  # noqa: E402
from vsr.runtime.service import ServeConfig  # noqa: E402

pytestmark = pytest.mark.ray


@contextlib.contextmanager
def torch_threads(n: int):
    """fp32 GEMM bytes on the CPU depend on the thread count: a replica's answers are those of an
    engine with its threads (RayOptions.cpus_per_replica)."""
    import torch
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def test_options_become_ray_serve_deployment_options():
    cfg = ServeConfig(replicas=3, max_batch=32, max_queue=100, graceful_timeout_s=7.0, device="cpu")
    fixed = rd.deployment_options(cfg, rd.RayOptions(cpus_per_replica=2), "cpu")
    assert fixed == {"num_replicas": 3, "ray_actor_options": {"num_cpus": 2}, "max_ongoing_requests": 100,
                     "graceful_shutdown_timeout_s": 7.0}
    auto = rd.deployment_options(cfg, rd.RayOptions(autoscale=rd.parse_autoscale("1:4"), gpus_per_replica=0.5),
                                 "cuda")
    assert "num_replicas" not in auto and auto["ray_actor_options"] == {"num_cpus": 1.0, "num_gpus": 0.5}
    assert auto["autoscaling_config"] == {"min_replicas": 1, "max_replicas": 4, "target_ongoing_requests": 32}
    for bad in ("4", "0:2", "3:2", "a:b", "1:"):
        with pytest.raises(ValueError, match="autoscale"):
            rd.parse_autoscale(bad)
    with pytest.raises(ValueError, match="--device cuda"):
        rd.replica_device(ServeConfig(device="cuda:1"))


def test_two_cpu_replicas_answer_through_the_ray_proxy(engine):
    port = free_port()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        logged = []
        rd.start(ServeConfig(device="cpu", port=port, replicas=2, max_batch=16), rd.RayOptions(), log=logged.append)
        assert "Ray Serve, 2 replicas on cpu" in logged[0]
        url = f"http://127.0.0.1:{port}"
        assert httpx.get(url + "/health").json()["status"] == "ready"
        assert httpx.get(url + "/v1/models").json()["data"][0]["id"] == "vsr/intent-minilm"
        bodies = [{"input": [TEXTS[(5 * i + j) % len(TEXTS)] for j in range(1 + i % 3)]} for i in range(32)]
        replicas = set()
        for body, r in zip(bodies, asyncio.run(post_all(url, bodies)), strict=True):
            assert r.status_code == 200, r.text
            with torch_threads(int(rd.RayOptions().cpus_per_replica)):
                probs, results = alone(engine, body["input"])
            got = r.json()["data"]
            assert [d["probs"] for d in got] == probs          # the service's answer, bit for bit
            assert [d["top"] for d in got] == [x["top"] for x in results]
            replicas.add(r.headers["x-vsr-replica"])
        assert len(replicas) == 2   # Ray's proxy spread the calls over both replicas
        bad = httpx.post(url + "/v1/classify", json={"input": ["fine", "   "]})
        assert bad.status_code == 422 and bad.json()["error"]["index"] == 1
    finally:
        rd.stop()
    assert not ray.is_initialized()


def test_cli_refuses_before_ray_starts():
    r = subprocess.run([sys.executable, "-m", "vsr.cli.run", "serve", "--ray", "--device", "cpu", "--port",
                        str(free_port()), "--revision", "not-this-one"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 4 and "revision" in r.stderr and "Ray" not in r.stderr
    r = subprocess.run([sys.executable, "-m", "vsr.cli.run", "serve", "--autoscale", "1:2"], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 2 and "--autoscale need --ray" in r.stderr
    r = subprocess.run([sys.executable, "-m", "vsr.cli.run", "serve", "--ray", "--autoscale", "2:1"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "MIN <= MAX" in r.stderr


def test_cli_serves_through_ray_with_autoscaling_and_stops_on_sigterm(engine):
    proc, url = start_server("--ray", "--autoscale", "1:2", timeout=120)
    try:
        texts = ["open the garage door", "what's the weather like tomorrow"]
        r = httpx.post(url + "/v1/classify", json={"input": texts})
        assert r.status_code == 200, r.text
        with torch_threads(int(rd.RayOptions().cpus_per_replica)):
            assert [d["probs"] for d in r.json()["data"]] == alone(engine, texts)[0]
    finally:
        assert stop(proc) == 0
