"""`xg2 serve`: the cache shards, the model replicas and the mask service, on a local Ray (or a
Ray cluster it joins with `--address`), on the loopback by default, until SIGINT or SIGTERM.

What it deployed ends with it. On a Ray it joined, its applications are deleted (the shards with
their keeper), and Serve itself is shut down when no other application is left on it. A Ray of its
own (no `--address`) is a `LocalRay`: only the Ray components the application needs, started so
that a busy machine makes the start slower, not a failure, and ended whole, with every process it
started (see LocalRay).

Each step of a start waits with a bound of its own (SERVE_START_TIMEOUT_S, APP_START_TIMEOUT_S,
HEALTH_TIMEOUT_S), says every PROGRESS_EVERY_S that it is still waiting and on what, and fails
naming the step that ran out; SIGINT or SIGTERM during a start stops it there, and what it had
started goes."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from xg2.errors import UsageError

from .local_ray import LocalRay, signal_handlers_kept

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


#: The bounds of a start's steps, in seconds. Each is said when it runs out; none is a quiet
#: machine's time: a busy machine makes a start slower, not a failure.
SERVE_START_TIMEOUT_S = 300.0       # Serve's controller and HTTP proxy up
APP_START_TIMEOUT_S = 900.0         # an application RUNNING (every replica constructed: the model loaded)
HEALTH_TIMEOUT_S = 300.0            # GET /health answered 200 through Serve's proxy
APP_STOP_TIMEOUT_S = 120.0          # an application deleted from a cluster joined
#: How often a step that is still waiting says so.
PROGRESS_EVERY_S = 15.0


def _within(fn: Callable[[], str], timeout_s: float) -> str:
    """fn()'s answer, or that it gave none within `timeout_s` (a status read never holds a bound up)."""
    out: list[str] = []
    t = threading.Thread(target=lambda: out.append(fn()), daemon=True)
    t.start()
    t.join(timeout_s)
    return out[0] if out else f"no status within {timeout_s:g} s"


def _app_status(serve: Any, name: str) -> str:
    """An application's status and its deployments not yet healthy, in a few words."""
    try:
        app = serve.status().applications.get(name)
    except Exception as e:      # noqa: BLE001 - only said
        return f"status unknown ({type(e).__name__})"
    if app is None:
        return "not deployed yet"
    value = lambda x: getattr(x, "value", x)
    pending = [f"{d} {value(ds.status)}" + (f" ({ds.message[:120]})" if ds.message else "")
               for d, ds in app.deployments.items() if value(ds.status) != "HEALTHY"]
    return f"{value(app.status)}" + (f"; {', '.join(pending)}" if pending else "")


def _serve_controller(ray: Any) -> Any:
    """The handle of Serve's controller on the Ray joined, or None: Serve is not running there."""
    from ray.serve._private.constants import SERVE_CONTROLLER_NAME, SERVE_NAMESPACE

    try:
        return ray.get_actor(SERVE_CONTROLLER_NAME, namespace=SERVE_NAMESPACE)
    except ValueError:
        return None


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
        self._ray: LocalRay | None = None      # a Ray of its own, started here
        self._joined = False                    # a cluster joined (--address) by this Server
        self.interrupting = False               # SIGINT sent by a start step's watch (see _bounded)
        self._apps: list[str] = []
        self._serve_found = False               # Serve already ran on the Ray joined: left running at the stop

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
        # ... and a starting proxy that has not answered its readiness check 3 times in a row, each
        # by default within 5 s: on a busy machine its start (a worker, Serve's imports) took
        # longer, and it was killed, over and over. A proxy that died answers at once either way.
        os.environ.setdefault("RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S", "60")
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
            if self.address:        # a cluster joined: its components are its own
                with signal_handlers_kept():
                    ray.init(address=self.address, logging_level="ERROR", namespace="xg2", log_to_driver=self.progress)
                self._joined = True
            else:                   # a Ray of this process's own, on the loopback only
                self._ray = LocalRay(namespace="xg2", log_to_driver=self.progress, say=self.say).start()
        try:
            self._bounded("starting Serve", lambda: self._start_serve(serve, ray), SERVE_START_TIMEOUT_S)
            args = {"model": self.model, "replicas": self.replicas, "shards": self.shards,
                    "shard_prefix": self.shard_prefix, "shard_namespace": "xg2", "max_batch": self.max_batch,
                    **self.options, **{f"replica_{k}": v for k, v in self.model_placement.items()}}
            if self.api_keys is not None:
                args["api_keys"] = self.api_keys
                args["open_tenants"] = self.open_tenants
            self.say(f"starting {self.shards} cache shard(s), {self.replicas} model replica(s)")
            from .shards import build_shards

            # the shards first (their keeper answers once every shard does): the replicas find them
            if self.shards:     # 0: no cache tier (each replica's own caches only)
                self._run(serve, build_shards({"shards": self.shards, "shard_prefix": self.shard_prefix,
                                               "shard_namespace": "xg2", "shard_mb": self.shard_mb}),
                          "xg2-shards", None)
            apps = [(build(args), "xg2", "/")]
            if self.mask_service:
                apps.append((build_masks({"model": self.model, "replicas": self.mask_replicas, "shards": self.shards,
                                          "shard_prefix": self.shard_prefix, "shard_namespace": "xg2",
                                          "api_keys": self.api_keys, "open_tenants": self.open_tenants}),
                             "xg2-masks", None))
            self._run_together(serve, apps)
            self._wait_healthy()
        except BaseException:
            self.stop()         # what was deployed goes, whatever failed
            raise
        self.say(f"serving at {self.url} (OpenAI API; GET /health) in {time.perf_counter() - t0:.1f} s")
        return self

    def _start_serve(self, serve: Any, ray: Any) -> None:
        options = {"http_options": {"host": self.host, "port": self.port}, "logging_config": {"log_level": "WARNING"},
                   **({"proxy_location": self.proxy_location} if self.proxy_location else {})}
        controller = _serve_controller(ray)
        if controller is not None:
            # Serve already runs here (someone else's applications, or a test session's): this
            # Server's applications go beside them, behind its HTTP proxy on the port it was given
            # when it started (Serve takes no other), and Serve stays when they go.
            self._serve_found = True
            port = ray.get(controller.get_http_config.remote(), timeout=30).port
            if port != self.port:
                self.say(f"Serve already runs on this Ray with its HTTP proxy on port {port}: serving there")
                self.port = port
            return
        try:
            serve.start(**options)
        except (TimeoutError, ray.exceptions.RayActorError) as e:
            # The HTTP proxy was not up within Serve's own 60 s, or was replaced while it started:
            # its controller is up and starts it again, and the wait for /health below waits for it.
            self.say(f"Serve's HTTP proxy is not up yet ({type(e).__name__}); going on, /health waits for it")
            serve.start(**options)      # the controller started above, found

    def _run(self, serve: Any, app: Any, name: str, route_prefix: str | None) -> None:
        self._apps.append(name)
        t0 = time.monotonic()
        self._bounded(f"starting {name}", lambda: serve.run(app, name=name, route_prefix=route_prefix),
                      APP_START_TIMEOUT_S, status=lambda: _app_status(serve, name))
        self.say(f"{name} running ({time.monotonic() - t0:.1f} s)")

    def _run_together(self, serve: Any, apps: list[tuple[Any, str, str | None]]) -> None:
        """The model and mask applications deployed at once (neither needs the other; started one
        after the other they cost their sum, some 10 s more per start), each named in what is
        still awaited. One by one on a Ray without `serve.run_many`."""
        run_many = getattr(serve, "run_many", None)
        if len(apps) == 1 or run_many is None:
            for app, name, prefix in apps:
                self._run(serve, app, name, prefix)
            return
        from ray.serve.api import RunTarget

        names = [name for _, name, _ in apps]
        self._apps.extend(names)
        t0 = time.monotonic()
        targets = [RunTarget(app, name=name, route_prefix=prefix) for app, name, prefix in apps]
        self._bounded(f"starting {' and '.join(names)}", lambda: run_many(targets), APP_START_TIMEOUT_S,
                      status=lambda: "; ".join(f"{n} {_app_status(serve, n)}" for n in names))
        self.say(f"{' and '.join(names)} running ({time.monotonic() - t0:.1f} s)")

    def _bounded(self, what: str, fn: Callable[[], Any], timeout_s: float,
                 status: Callable[[], str] | None = None) -> Any:
        """fn(), here on the main thread, watched by a thread of its own: it says every
        PROGRESS_EVERY_S that `what` is still waiting (with `status()`), and interrupts it (SIGINT
        to this thread, which Ray's waits and Serve's answer) once `timeout_s` has passed or this
        Ray's GCS or raylet has exited: then TimeoutError or RuntimeError, naming `what`. On the
        main thread, not a thread of its own: a stop must find nothing still calling Serve, which
        would start a new Ray once this one is shut down. (Off the main thread: fn(), unwatched.)"""
        if threading.current_thread() is not threading.main_thread():
            return fn()
        reason: list[Exception] = []
        lock, done = threading.Lock(), threading.Event()

        def watch() -> None:
            t0 = said = time.monotonic()
            while not done.wait(0.5):
                now, why = time.monotonic(), None
                if now - t0 > timeout_s:
                    why = TimeoutError(f"{what}: not done within {timeout_s:g} s"
                                       + (f" ({_within(status, 5.0)})" if status else ""))
                elif self._ray is not None:
                    try:
                        self._ray.check()
                    except RuntimeError as e:
                        why = RuntimeError(f"{what}: {e}")
                if why is None:
                    if now - said >= PROGRESS_EVERY_S:
                        said = now
                        self.say(f"{what}: still waiting ({now - t0:.0f} s of at most {timeout_s:.0f} s)"
                                 + (f": {_within(status, 5.0)}" if status else ""))
                    continue
                with lock:
                    if not done.is_set():
                        reason.append(why)
                        self.interrupting = True
                        signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
                return

        handler = None
        if not callable(signal.getsignal(signal.SIGINT)):     # ignored or the default: a handler for the interrupt
            handler = signal.signal(signal.SIGINT, signal.default_int_handler)
        watcher = threading.Thread(target=watch, name=f"xg2-watch-{what}", daemon=True)
        watcher.start()
        try:
            try:
                result = fn()
            finally:
                with lock:
                    done.set()
                watcher.join()
            if reason:
                time.sleep(0.1)         # an interrupt sent as fn returned lands here
            return result
        except KeyboardInterrupt:
            if reason:
                raise reason[0] from None
            raise
        finally:
            self.interrupting = False
            if handler is not None:
                signal.signal(signal.SIGINT, handler)

    def _wait_healthy(self, timeout_s: float = HEALTH_TIMEOUT_S) -> None:
        import urllib.request

        t0 = time.monotonic()
        said, last = t0, "no answer yet"
        while True:
            try:
                with urllib.request.urlopen(f"http://{self.host}:{self.port}/health", timeout=5) as r:
                    if r.status == 200:
                        return
                    last = f"status {r.status}"
            except OSError as e:
                last = str(e)
            if self._ray is not None:
                self._ray.check()
            now = time.monotonic()
            if now - t0 > timeout_s:
                raise TimeoutError(f"the application did not answer /health within {timeout_s:.0f} s ({last})")
            if now - said >= PROGRESS_EVERY_S:
                said = now
                self.say(f"waiting for /health ({now - t0:.0f} s of at most {timeout_s:.0f} s): {last}")
            time.sleep(0.2)

    def stop(self) -> None:
        import ray
        from ray import serve

        if self._ray is not None:
            # The Ray is this process's own: everything deployed on it ends with it, at once and
            # whatever state it is in (no graceful deletion that a busy machine would drag out).
            self.say("shutting down")
            local, self._ray, self._apps = self._ray, None, []
            local.stop()
            return
        if not ray.is_initialized():
            return
        self.say("shutting down")
        try:
            for name in reversed(self._apps):       # the shards' keeper last: the others use them
                try:
                    self._bounded(f"deleting {name}", lambda name=name: serve.delete(name), APP_STOP_TIMEOUT_S)
                except Exception as e:      # noqa: BLE001 - the others still go
                    self.say(f"could not delete the application {name}: {e}")
            self._apps = []
            if not self._serve_found and not serve.status().applications:
                serve.shutdown()        # Serve's own actors too, when this Server started them and nothing else runs
        finally:
            for i in range(self.shards):        # in case the keeper could not take them with it
                try:
                    ray.kill(ray.get_actor(f"{self.shard_prefix}-{i}", namespace="xg2"), no_restart=True)
                except ValueError:
                    pass
            if self._joined:
                self._joined = False
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
    starting = [True]
    signalled: list[int] = []

    def on_signal(signum: int, _frame: Any) -> None:
        if server.interrupting:     # a start step's watch: that step ran out of time (Server._bounded)
            raise KeyboardInterrupt
        # Serving: stop cleanly from the main loop below. Starting: the start stops where it is
        # (as KeyboardInterrupt, which Ray's waits let through; Server.start ends what it
        # started), once: a second signal does not cut that short.
        first = not stop.is_set()
        stop.set()
        if first:
            signalled.append(signum)
            if starting[0]:
                raise KeyboardInterrupt

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, on_signal)
    try:
        server.start()
        starting[0] = False
    except KeyboardInterrupt:
        server.stop()           # (nothing left to stop, unless the signal came as the start ended)
        if not signalled:
            raise
        print(f"xg2 serve: stopped by {signal.Signals(signalled[0]).name} while starting", file=sys.stderr, flush=True)
        return 128 + signalled[0]
    except Exception as e:      # noqa: BLE001 - said in one line: what failed, with what it said
        print(f"xg2 serve: the start failed: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        return 1
    try:
        print(f"xg2 serving {args.model} at {server.url} -- Ctrl-C to stop", flush=True)
        stop.wait()
    finally:
        server.stop()
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="xg2 serve", description=__doc__)
    add_arguments(ap)
    return run(ap.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
