"""Scale-out on Ray Serve: the same OpenAI app (server/app.py) as a Ray Serve deployment of N
replicas, each a separate process with its own models, its own model thread and its own slots.

Why Ray Serve and not cluster code of our own: it already has what a replica set needs, and has it
tested — an HTTP proxy on every node that routes each request to the less busy of two sampled
replicas, health checks and restarts, streaming responses, and clusters of several machines
(``ray start --head`` on one, ``ray start --address HEAD:6379`` on the others). We hand it one
builder that loads the models inside each replica; nothing in the app knows it runs under Ray.

Used by ``specdec serve --ray --replicas N``; from Python::

    from ray import serve
    from specdec.server.ray_app import RaySettings, deployment
    serve.run(deployment(my_builder, RaySettings(replicas=2)), route_prefix="/")

Each replica is a Ray actor reserving ``cpus_per_replica`` CPUs, and runs torch with that many
threads. On one machine replicas share its memory bus: decoding is memory-bound, so two replicas on
two cores do not double a single replica's tokens/s (results/ says what was measured).
"""

from __future__ import annotations

import re
import signal
import sys
import threading
from dataclasses import dataclass
from typing import Any, Callable

from specdec.errors import SpecdecError
from specdec.server.params import RETRY_AFTER_S

#: the app's name in Ray Serve (``serve status``, ``serve.delete``)
APP_NAME = "specdec"


@dataclass(frozen=True)
class RaySettings:
    replicas: int = 1
    #: CPUs Ray reserves per replica (a replica that cannot get them waits, Ray says so in its log)
    cpus_per_replica: float = 1.0
    #: None: start a private local cluster; "auto": the local one `ray start` made; "host:port": a remote head
    address: str | None = None
    host: str = "127.0.0.1"
    port: int = 8000
    #: requests a replica serves at once and holds waiting (its --max-concurrency and --max-queue): what Ray's proxy
    #: hands it at most; beyond every replica's, the proxy holds as many again (PROXY_QUEUE_SHARE) and answers 429
    max_ongoing_requests: int = 65
    #: forward the replicas' stdout/stderr to this terminal (--enable-log-requests: the request lines are theirs)
    log_to_driver: bool = False

    def __post_init__(self) -> None:
        if self.replicas < 1:
            raise SpecdecError(f"--replicas must be at least 1, got {self.replicas}")
        if self.cpus_per_replica <= 0:
            raise SpecdecError(f"--ray-cpus-per-replica must be positive, got {self.cpus_per_replica}")


#: Ray's proxy queued requests beyond every replica's slots and queue without limit (a walkthrough:
#: --max-concurrency 1 --max-queue 1 on 2 replicas answered 6 of 6 concurrent requests, the last after 8.7 s in the
#: proxy, where one process answered 2 and 429 to 4). Now it holds at most as many as the replicas' slots and queues
#: together, and answers the rest 429. Why not fewer: the proxy's count includes requests of a burst not yet handed
#: to a replica with room (a limit of one per replica refused 20 concurrent requests on 2 idle replicas). Why not let
#: replicas take the overflow and refuse it with their own 429 body: the proxy picks the less busy of two sampled
#: replicas, so with 3 or more both could be full while a third had room. The proxy's 429 is Ray's (a text body,
#: with Retry-After), not an OpenAI error object.
PROXY_QUEUE_SHARE = 1.0


def ray_serve() -> Any:  # noqa: ANN401 - the ray.serve module
    try:
        from ray import serve
    except ImportError:
        raise SpecdecError("--ray needs Ray Serve: pip install 'specdec[ray]' (or 'ray[serve]')") from None
    return serve


def deployment(build: Callable[[], Any], settings: RaySettings) -> Any:  # noqa: ANN401 - a ray.serve.Application
    """A Ray Serve application whose replicas each call ``build()`` (returns the ASGI app, models
    loaded) once, at replica start. ``build`` must be a plain function or lambda: Ray pickles it
    to every node, where specdec must be installed too."""
    serve = ray_serve()

    class SpecdecReplica:
        """One replica: Ray's ASGI wrapper calls ``build`` after this constructor."""

    ingress = serve.ingress(build)(SpecdecReplica)
    return serve.deployment(ingress, name="SpecdecReplica", **deployment_options(settings)).bind()


def deployment_options(settings: RaySettings) -> dict[str, Any]:
    """The replica deployment's Ray Serve options: how many, their CPUs, how many requests the proxy hands each one
    (its slots and queue) and holds itself before a 429; with the replicas' output forwarded (request logs), Ray's
    own access log lines are left out (each request was logged twice)."""
    options: dict[str, Any] = {"num_replicas": settings.replicas, "ray_actor_options": {"num_cpus": settings.cpus_per_replica},
                               "max_ongoing_requests": settings.max_ongoing_requests,
                               "max_queued_requests": max(1, round(PROXY_QUEUE_SHARE * settings.max_ongoing_requests
                                                                   * settings.replicas))}
    if settings.log_to_driver:
        options["logging_config"] = {"enable_access_log": False}
    try:  # the proxy's refusals as 429 (Ray's default is 503, "unavailable", for a server that is up); older Ray: 503
        from ray.serve.config import BackpressureConfig

        options["backpressure_config"] = BackpressureConfig(status_code=429, retry_after_s=RETRY_AFTER_S)
    except ImportError:
        pass
    return options


def replica_failure(serve: Any, error: Exception) -> SpecdecError:  # noqa: ANN401 - the ray.serve module
    """One line for a deployment whose replicas failed to start: the replica's own SpecdecError (any of its
    subclasses: a draft that does not pair, a model missing on a worker node) where Ray's status
    carries its traceback (a bad flag only the loaded model can judge), else Ray's words and where the logs are —
    the driver does not print the replicas' output (log_to_driver), and Ray's traceback named neither."""
    try:
        message = serve.status().applications[APP_NAME].deployments["SpecdecReplica"].message
    except Exception:  # noqa: BLE001 - the status itself failed: keep Ray's error
        message = ""
    causes = [match.group(1).strip() for match in re.finditer(r"specdec\.errors\.\w+: (.*)", message)]
    if causes:
        return SpecdecError(f"a replica failed to start: {causes[-1]}")
    why = (str(error).splitlines() or [type(error).__name__])[0]
    return SpecdecError(f"Ray Serve could not start the replicas ({why}); their logs are under "
                        "/tmp/ray/session_latest/logs/serve/")


def serve_on_ray(build: Callable[[], Any], settings: RaySettings, name: str) -> None:
    """Connect to (or start) a Ray cluster, run the deployment behind Ray's proxy on
    ``settings.host:settings.port`` and block until SIGINT/SIGTERM/SIGHUP; then delete the app and, for a
    private cluster, stop it."""
    serve = ray_serve()
    import ray

    try:
        ray.init(address=settings.address, include_dashboard=False, logging_level="WARNING",
                 log_to_driver=settings.log_to_driver, configure_logging=True)
    except ConnectionError as exc:  # Ray's own words name its `--address` flag, not ours
        where = f"--ray-address {settings.address}" if settings.address else "RAY_ADDRESS (the environment)"
        why = (str(exc).splitlines() or [type(exc).__name__])[0]
        raise SpecdecError(f"{where}: no Ray cluster to join ({why}); start one with `ray start --head`, or leave "
                           "--ray-address (and RAY_ADDRESS) out for a private one") from None
    stop = threading.Event()
    # SIGHUP too: a closed terminal killed the driver without deleting the app (Ray's agents lingered for minutes)
    for sig in (signal.SIGINT, signal.SIGTERM, getattr(signal, "SIGHUP", signal.SIGTERM)):
        signal.signal(sig, lambda *_: stop.set())
    try:
        serve.start(http_options={"host": settings.host, "port": settings.port})
        print(f"starting {settings.replicas} Ray Serve replica(s) of {name} "
              f"({settings.cpus_per_replica:g} CPU each) …", file=sys.stderr, flush=True)
        try:
            serve.run(deployment(build, settings), name=APP_NAME, route_prefix="/", blocking=False)
        except RuntimeError as exc:  # "Deploying application specdec failed: ..." after the replicas' retries
            raise replica_failure(serve, exc) from None
        print(f"serving {name} on http://{settings.host}:{settings.port} with {settings.replicas} Ray Serve replica(s); "
              "Ctrl-C stops", file=sys.stderr, flush=True)
        stop.wait()
    finally:
        try:
            serve.delete(APP_NAME)
            if settings.address is None:
                serve.shutdown()
        finally:
            ray.shutdown()
