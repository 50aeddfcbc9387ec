"""`vsr-run serve --ray`: the service's engine and Starlette app as a Ray Serve deployment (docs/serve.md).

Each Ray Serve replica builds the same Service as `vsr-run serve` (vsr.runtime.service.build_service:
every check, the engine, its Batcher) and serves the same app (create_app: the same endpoints, errors
and answers) through Ray Serve's ASGI ingress; Ray Serve's own HTTP proxy takes the calls and routes
each to a replica. Replicas are a fixed count or Ray Serve's autoscaling between a minimum and a
maximum; on a GPU each replica asks Ray for its share of a GPU and Ray makes that GPU its `cuda`.
Nothing here places processes or balances calls: Ray does.

Needs the `ray` extra (`pip install 'vsr[ray]'`, Ray Serve 2.47 or later: an ingress built on each
replica by a function).
"""
from __future__ import annotations

import signal
import threading
from dataclasses import asdict, dataclass

import ray
from ray import serve

from vsr.runtime.service import ServeConfig, build_service, create_app, resolve_device

APP_NAME = "vsr"


@dataclass
class RayOptions:
    autoscale: tuple[int, int] | None = None   # (min, max) replicas; None: ServeConfig.replicas, fixed
    address: str | None = None                 # a Ray cluster to join (None: RAY_ADDRESS, else a local instance)
    cpus_per_replica: float = 1.0              # Ray's num_cpus of a replica (its torch threads on the CPU)
    gpus_per_replica: float = 1.0              # Ray's num_gpus of a replica on CUDA (0.5: two share a GPU)
    target_ongoing: float | None = None        # autoscaling's target calls in flight per replica (None: max_batch)


def parse_autoscale(text: str) -> tuple[int, int]:
    """"MIN:MAX" -> (MIN, MAX), 1 <= MIN <= MAX."""
    lo, sep, hi = text.partition(":")
    if not sep or not lo.strip().isdigit() or not hi.strip().isdigit():
        raise ValueError(f"autoscale {text!r} is not MIN:MAX (two whole numbers, e.g. 1:4)")
    lo, hi = int(lo), int(hi)
    if not 1 <= lo <= hi:
        raise ValueError(f"autoscale {text!r}: need 1 <= MIN <= MAX")
    return lo, hi


def replica_device(cfg: ServeConfig) -> str:
    """The device each replica loads its engine on: `cuda` (the GPU Ray gave that replica) or `cpu`."""
    import torch
    dev = torch.device(resolve_device(cfg.device))
    if dev.index is not None:
        raise ValueError(f"with Ray, each replica runs on the GPU Ray gives it: give --device {dev.type}, "
                         f"not {dev}")
    return dev.type


def deployment_options(cfg: ServeConfig, opts: RayOptions, device: str) -> dict:
    """The keyword arguments of serve.deployment: replicas (or autoscaling), actor resources, calls
    in flight per replica (the service's own queue bounds them: a full one answers 503)."""
    actor = {"num_cpus": opts.cpus_per_replica}
    if device == "cuda":
        actor["num_gpus"] = opts.gpus_per_replica
    out = {"ray_actor_options": actor, "max_ongoing_requests": cfg.max_queue,
           "graceful_shutdown_timeout_s": cfg.graceful_timeout_s}
    if opts.autoscale is None:
        out["num_replicas"] = cfg.replicas
    else:
        lo, hi = opts.autoscale
        out["autoscaling_config"] = {"min_replicas": lo, "max_replicas": hi,
                                     "target_ongoing_requests": opts.target_ongoing or cfg.max_batch}
    return out


def application(cfg: ServeConfig, opts: RayOptions | None = None):
    """The bound Ray Serve application (serve.run takes it): a deployment whose replicas each build
    the service and its app on start (the app's lifespan loads nothing more: it warms the engine up
    and, at shutdown, drains the batcher)."""
    opts = opts or RayOptions()
    device = replica_device(cfg)
    fields = asdict(cfg)
    threads = max(1, int(opts.cpus_per_replica))

    def build_app():   # runs on each replica, in its own process
        import torch
        if device == "cpu":
            torch.set_num_threads(threads)
        tag = serve.get_replica_context().replica_tag
        return create_app(build_service(ServeConfig(**fields), replica=tag, device=device))

    return serve.deployment(serve.ingress(build_app)(), name="VsrService",
                            **deployment_options(cfg, opts, device)).bind()


def connect(opts: RayOptions | None = None) -> None:
    """Join the Ray cluster of opts.address (or RAY_ADDRESS), else start a local instance; nothing
    where Ray is already initialised (a caller's ray.init)."""
    if not ray.is_initialized():
        ray.init(address=(opts or RayOptions()).address, include_dashboard=False, log_to_driver=False)


def check_package(cfg: ServeConfig):
    """The package opened with every check vsr-run makes (device, identity, revision), no weights."""
    from vsr.runtime.package import open_package
    return open_package(cfg.package, revision=cfg.revision, allow_unverified=cfg.allow_unverified,
                        device=resolve_device(cfg.device), emulate=cfg.emulate)


def start(cfg: ServeConfig, opts: RayOptions | None = None, log=print, *, pkg=None) -> None:
    """Open the package with every check (check_package, unless `pkg` is its result), connect to
    Ray, start Ray Serve's proxy on cfg.host:cfg.port and run the application; returns once every
    replica has loaded its engine and answered its warm-up call."""
    opts = opts or RayOptions()
    pkg = pkg or check_package(cfg)
    app = application(cfg, opts)
    connect(opts)
    serve.start(http_options={"host": cfg.host, "port": cfg.port})
    serve.run(app, name=APP_NAME, route_prefix="/", logging_config={"enable_access_log": False})
    scale = (f"{cfg.replicas} replicas" if opts.autoscale is None
             else f"{opts.autoscale[0]} to {opts.autoscale[1]} replicas (autoscaling)")
    log(f"vsr-run serve: {pkg.name} revision {pkg.revision or '-'} (identity {pkg.identity_status}); "
        f"Ray Serve, {scale} on {replica_device(cfg)}; http://{cfg.host}:{cfg.port}")


def stop() -> None:
    """Shut Ray Serve down (each replica answers its calls in flight, up to graceful_timeout_s, and
    drains its batcher), then leave Ray (a local instance stops)."""
    serve.shutdown()
    ray.shutdown()


def run_ray_service(cfg: ServeConfig, opts: RayOptions | None = None, log=print) -> None:
    """start, then serve until SIGTERM/SIGINT, then stop. The handlers are set once Ray is up (its
    driver sets its own for SIGTERM, which would abort the process)."""
    opts = opts or RayOptions()
    pkg = check_package(cfg)   # a refused package stops here, before Ray starts
    done = threading.Event()
    try:
        connect(opts)
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: done.set())
        start(cfg, opts, log, pkg=pkg)
        while not done.wait(0.5):
            pass
        log("vsr-run serve: stopping Ray Serve")
    finally:
        stop()
