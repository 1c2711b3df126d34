"""`xg2 serve`: the cache shards, the model replicas and the mask service, on a local Ray (or a
Ray cluster it joins with `--address`), on the loopback by default, until SIGINT or SIGTERM.

What it deployed ends with it: its applications are deleted (the shards with their keeper), and
Serve itself is shut down when no other application is left on it, or when the Ray is its own."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

from xg2.errors import UsageError

if TYPE_CHECKING:
    from .keys import KeyRing


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--address", default=None,
                    help="join this Ray cluster (auto, or HOST:PORT of its head); default: start a local Ray")
    ap.add_argument("--host", default="127.0.0.1", help="address to listen on (default: the loopback only)")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--model", default="default",
                    help="default (SmolLM2-135M-Instruct), tiny (a random test model), or a model directory")
    ap.add_argument("--replicas", type=int, default=1, help="model replicas")
    ap.add_argument("--shards", type=int, default=2, help="cache shard actors")
    ap.add_argument("--max-batch", type=int, default=8, help="sequences decoded together per replica")
    ap.add_argument("--no-mask-service", action="store_true", help="do not start the mask service")
    ap.add_argument("--mask-replicas", type=int, default=2,
                    help="mask service replicas (each holds the sessions opened on it; default 2)")
    ap.add_argument("--api-keys", metavar="FILE", default=None,
                    help="the API keys, one 'TENANT KEY [admin]' per line: only these are let in, each as its "
                    "tenant; an admin key reads every tenant's figures at /v1/xg2/stats (see serve/keys.py)")
    ap.add_argument("--open-tenants", action="store_true",
                    help="let any bearer token not in --api-keys in as a tenant of its own, even off the loopback "
                    "(a client that changes keys then escapes every per-tenant limit)")
    ap.add_argument("--router", choices=("affinity", "default"), default="affinity",
                    help="how requests reach the model replicas: affinity (default: to the replica that holds "
                    "their grammar or most of their tools) or default (Serve's own routing, for comparison)")


class Server:
    """The application started in this process's Ray (a context manager: stopped on exit)."""

    def __init__(self, *, host: str = "127.0.0.1", port: int = 8000, model: str = "default", replicas: int = 1,
                 shards: int = 2, max_batch: int = 8, mask_service: bool = True, progress: bool = True,
                 api_keys: KeyRing | dict[str, str] | None = None, open_tenants: bool = False,
                 options: dict[str, Any] | None = None,
                 shard_mb: int | None = None, address: str | None = None, mask_replicas: int = 2,
                 proxy_location: str | None = None, model_placement: dict[str, Any] | None = None):
        from xg2.actors.keeper import shard_prefix

        from .keys import is_loopback

        if api_keys is None and not open_tenants and not is_loopback(host):
            raise UsageError(f"refusing to serve on {host} without API keys: any bearer token would be a tenant of "
                             "its own, and a client that changes keys escapes every per-tenant limit. Give the keys "
                             "(--api-keys FILE), listen on the loopback (--host 127.0.0.1), or say --open-tenants")
        self.address = address
        self.host, self.port, self.model = host, port, model
        self.shard_mb = shard_mb        # each cache shard's budget (None: xg2.actors.shard's default)
        self.replicas, self.shards, self.max_batch = replicas, shards, max_batch
        self.mask_service, self.progress, self.api_keys = mask_service, progress, api_keys
        self.open_tenants = open_tenants
        self.mask_replicas = mask_replicas
        self.options = dict(options or {})
        # Serve's HTTP proxies (None: Serve's default, one on every node), and where the model
        # replicas go (`resources`, `max_replicas_per_node`; see serve.app.build)
        self.proxy_location = proxy_location
        self.model_placement = dict(model_placement or {})
        self.shard_prefix = shard_prefix()     # this build's: another build's shards are not these
        self._started_ray = False
        self._apps: list[str] = []

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    def say(self, msg: str) -> None:
        if self.progress:
            print(f"xg2: {msg}", file=sys.stderr, flush=True)

    def start(self):
        # Ray's servers take the node's address; with this set it is the loopback (127.0.0.1)
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
        # Serve replaces a dead HTTP proxy after 3 failed health checks, by default 10 s apart: 30 s
        # without an ingress (measured); 2 s apart it is back in about 7 s. Read by Serve's
        # controller, which inherits this environment from the Ray started below.
        os.environ.setdefault("RAY_SERVE_PROXY_HEALTH_CHECK_PERIOD_S", "2")
        import ray
        from ray import serve

        from .app import build, build_masks
        from .model import load_model

        t0 = time.perf_counter()
        # Converted here first (with progress on this terminal) so the replicas read the cache.
        self.say(f"loading the model ({self.model})")
        load_model(self.model, progress=self.progress)
        self.say(f"model ready ({time.perf_counter() - t0:.1f} s); starting Ray")
        if not ray.is_initialized():
            # ray.init puts its own SIGTERM handler in (it exits at once, leaving what was deployed
            # running); the caller's handlers (run's: stop cleanly) are put back after it
            handlers = {}
            if threading.current_thread() is threading.main_thread():
                handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
            local = {} if self.address else {"_node_ip_address": "127.0.0.1"}    # a local Ray: the loopback only
            ray.init(address=self.address or "local", include_dashboard=False if not self.address else None,
                     logging_level="ERROR", namespace="xg2", log_to_driver=self.progress, **local)
            self._started_ray = True
            for sig, handler in handlers.items():
                signal.signal(sig, handler)
        serve.start(http_options={"host": self.host, "port": self.port}, logging_config={"log_level": "WARNING"},
                    **({"proxy_location": self.proxy_location} if self.proxy_location else {}))
        args = {"model": self.model, "replicas": self.replicas, "shards": self.shards,
                "shard_prefix": self.shard_prefix, "shard_namespace": "xg2", "max_batch": self.max_batch,
                **self.options, **{f"replica_{k}": v for k, v in self.model_placement.items()}}
        if self.api_keys is not None:
            args["api_keys"] = self.api_keys
            args["open_tenants"] = self.open_tenants
        self.say(f"starting {self.shards} cache shard(s), {self.replicas} model replica(s)")
        from .shards import build_shards

        try:
            # the shards first (their keeper answers once every shard does): the replicas find them
            if self.shards:     # 0: no cache tier (each replica's own caches only)
                self._run(serve, build_shards({"shards": self.shards, "shard_prefix": self.shard_prefix,
                                               "shard_namespace": "xg2", "shard_mb": self.shard_mb}),
                          "xg2-shards", None)
            self._run(serve, build(args), "xg2", "/")
            if self.mask_service:
                self._run(serve, build_masks({"model": self.model, "replicas": self.mask_replicas, "shards": self.shards,
                                              "shard_prefix": self.shard_prefix, "shard_namespace": "xg2",
                                              "api_keys": self.api_keys, "open_tenants": self.open_tenants}),
                          "xg2-masks", None)
            self._wait_healthy()
        except BaseException:
            self.stop()         # what was deployed goes, whatever failed
            raise
        self.say(f"serving at {self.url} (OpenAI API; GET /health) in {time.perf_counter() - t0:.1f} s")
        return self

    def _run(self, serve: Any, app: Any, name: str, route_prefix: str | None) -> None:
        self._apps.append(name)
        serve.run(app, name=name, route_prefix=route_prefix)

    def _wait_healthy(self, timeout_s: float = 300.0) -> None:
        import urllib.request

        deadline = time.monotonic() + timeout_s
        while True:
            try:
                with urllib.request.urlopen(f"http://{self.host}:{self.port}/health", timeout=5) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"the application did not answer /health within {timeout_s:.0f} s")
            time.sleep(0.2)

    def stop(self) -> None:
        import ray
        from ray import serve

        if not ray.is_initialized():
            return
        self.say("shutting down")
        try:
            for name in reversed(self._apps):       # the shards' keeper last: the others use them
                try:
                    serve.delete(name)
                except Exception as e:      # noqa: BLE001 - the others still go
                    self.say(f"could not delete the application {name}: {e}")
            self._apps = []
            others = serve.status().applications if not self._started_ray or self.address else {}
            if not others:
                serve.shutdown()        # Serve's own actors too, when nothing else of anyone's runs on it
        finally:
            for i in range(self.shards):        # in case the keeper could not take them with it
                try:
                    ray.kill(ray.get_actor(f"{self.shard_prefix}-{i}", namespace="xg2"), no_restart=True)
                except ValueError:
                    pass
            if self._started_ray:
                ray.shutdown()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def run(args: argparse.Namespace) -> int:
    from .keys import KeyRing

    try:
        keys = KeyRing.from_file(args.api_keys) if args.api_keys else None
        server = Server(host=args.host, port=args.port, model=args.model, replicas=args.replicas, shards=args.shards,
                        max_batch=args.max_batch, mask_service=not args.no_mask_service, address=args.address,
                        mask_replicas=args.mask_replicas, api_keys=keys, open_tenants=args.open_tenants,
                        options={"router": args.router})
    except UsageError as e:
        print(f"xg2 serve: {e}", file=sys.stderr)
        return 2
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    with server:
        print(f"xg2 serving {args.model} at {server.url} -- Ctrl-C to stop", flush=True)
        stop.wait()
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="xg2 serve", description=__doc__)
    add_arguments(ap)
    return run(ap.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
