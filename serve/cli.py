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
import atexit
import contextlib
import os
import re
import signal
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable
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


#: The bounds of a start's steps, in seconds. Each is said when it runs out; none is a quiet
#: machine's time: a busy machine makes a start slower, not a failure.
SERVE_START_TIMEOUT_S = 300.0       # Serve's controller and HTTP proxy up
APP_START_TIMEOUT_S = 900.0         # an application RUNNING (every replica constructed: the model loaded)
HEALTH_TIMEOUT_S = 300.0            # GET /health answered 200 through Serve's proxy
APP_STOP_TIMEOUT_S = 120.0          # an application deleted from a cluster joined
#: How often a step that is still waiting says so.
PROGRESS_EVERY_S = 15.0
#: In the environment of every process of a LocalRay, naming that Ray: how its processes are found
#: when it stops, whatever started them and whatever they were reparented to.
OWNER_ENV = "XG2_RAY_OWNER"


def agent_ports() -> dict[str, int]:
    """Free loopback ports for a Ray node's agents, by RayParams' names. A raylet given them does
    not wait for the agents to say theirs: Ray 2.60's raylet waits at most 15 s for that (fixed in
    its code) and then exits, and on a busy machine the dashboard agent's imports alone took 18-30 s."""
    names = ("metrics_agent_port", "metrics_export_port", "dashboard_agent_listen_port", "runtime_env_agent_port")
    socks: list[socket.socket] = []
    try:
        for _ in names:         # all bound at once: four different ports
            s = socket.socket()
            socks.append(s)
            s.bind(("127.0.0.1", 0))
        return {name: s.getsockname()[1] for name, s in zip(names, socks)}
    finally:
        for s in socks:
            s.close()


@contextlib.contextmanager
def raylets_told_agent_ports():
    """Within it, a raylet that Ray starts from this process is told its dashboard agent's HTTP
    port when one was chosen (RayParams' `dashboard_agent_listen_port`, as agent_ports chooses
    them). Ray 2.60 gives that port to the agent alone; the raylet then waits for the agent to
    write it down, which the agent does once its imports are done and its HTTP server is up: 15 s
    at most (fixed in the raylet), after which the raylet exits and the node never registers."""
    from unittest import mock

    from ray._private import ray_constants, services

    start = services.start_ray_process

    def start_ray_process(command: list[str], process_type: str, *args: Any, **kwargs: Any) -> Any:
        if process_type == ray_constants.PROCESS_TYPE_RAYLET:
            agent = next((a for a in command if a.startswith("--dashboard_agent_command=")), "")
            port = re.search(r"--listen-port=(\d+)", agent)
            if port and int(port.group(1)):
                command = [*command, f"--dashboard_agent_listen_port={port.group(1)}"]
        return start(command, process_type, *args, **kwargs)

    with mock.patch.object(services, "start_ray_process", start_ray_process):
        yield


@contextlib.contextmanager
def _signal_handlers_kept():
    """ray.init puts its own SIGTERM handler in (it exits at once, leaving what was deployed
    running): the caller's handlers (run's: stop cleanly) are put back after it."""
    handlers = {}
    if threading.current_thread() is threading.main_thread():
        handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)


class LocalRay:
    """A Ray of this process's own, on the loopback, with the components a Serve application
    needs; stopped with every process it started.

    `ray.init(address="local")` starts a node whose raylet waits for its dashboard agent to write
    down its ports (after the agent's imports, its gRPC server and its HTTP server are up), 15 s at
    most (fixed in Ray 2.60's raylet), and then exits: the driver fails with "The current node timed
    out during startup". With the machine busy the agent took 18-30 s, and 9 of 13 starts of
    `xg2 serve` failed so. Here the node is started the way ray.init starts one
    (`ray._private.node.Node` from `RayParams`, after what ray.init does first: its log level, no
    usage statistics, token authentication), but
      - the agents' ports are chosen beforehand (agent_ports) and given to the raylet, the
        dashboard agent's HTTP port too (Ray gives that one to the agent only): the raylet
        registers at once, and the agents come up beside it, which nothing here waits for (no
        runtime_env, no dashboard, no metrics: `enable_metrics_collection` off);
      - no dashboard head (with include_dashboard=False it would serve usage statistics alone,
        and Node waits up to 60 s for it), no autoscaler monitor (one fixed node), no log monitor
        unless the workers' output is shown here (`log_to_driver`);
      - the workers (Serve's controller, proxy and replicas) run at the priority of everything
        else on the machine (`worker_niceness` 0; Ray's 15 gave each of them a 28th of a core
        beside one CPU-bound process at the default priority: beside two of them (and at times
        part of the test suite), starts of `xg2 serve --model tiny --no-mask-service` took 5 to
        10 minutes, against 1.5 minutes with the workers at 0; compile workers keep
        their own lower priority under the replica's, as xg2.actors.compile_workers means them to);
      - the driver does not wait for the first Python workers to start before it connects
        (`prestart_worker_first_driver` off: that wait is in C++, where a signal cannot end it;
        the first actor waits for its worker instead), and a worker has WORKER_REGISTER_TIMEOUT_S
        to register (Ray's 60 s is about what a worker's start can take on a busy machine; past
        it the worker is killed and started again);
    and this process then connects to it with ray.init(address=...). The start's own waits are
    Ray's and bounded (the raylet's registration, 30 s); a start that fails anyway is tried again
    (ATTEMPTS times in all), saying why.

    Every process of the node carries OWNER_ENV. `stop` ends the node as ray.shutdown does (the
    raylet first, which ends its workers and agents), then, after STOP_GRACE_S, kills whatever is
    still there of the node's process tree as it was before (an agent or worker that had not yet
    seen its raylet go, a replica's compile worker) or carries this node's mark (one that had been
    reparented away from the tree), saying what; it returns what is left even after that (nothing,
    but a process stuck in the kernel)."""

    WORKER_REGISTER_TIMEOUT_S = 120
    STOP_GRACE_S = 5.0
    ATTEMPTS = 2

    def __init__(self, *, num_cpus: int | None = None, namespace: str | None = None, log_to_driver: bool = False,
                 logging_level: str = "ERROR", say: Callable[[str], None] | None = None):
        self.num_cpus, self.namespace, self.log_to_driver = num_cpus, namespace, log_to_driver
        self.logging_level = logging_level
        self.say = say or (lambda _msg: None)
        self.node: Any = None
        self.owner = ""
        self.session_dir = ""
        self._atexit = False

    def start(self) -> LocalRay:
        # the loopback: for this process (as if said before ray was first imported) and every
        # process the node starts (they read it when they import ray)
        os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
        import ray
        from ray._private import ray_constants

        ray_constants.ENABLE_RAY_CLUSTER = False

        t0 = time.monotonic()
        for attempt in range(1, self.ATTEMPTS + 1):
            try:
                self._start_node()
                with _signal_handlers_kept():
                    ray.init(address=self.node.address, _node_ip_address="127.0.0.1", namespace=self.namespace,
                             logging_level=self.logging_level, log_to_driver=self.log_to_driver)
                break
            except Exception as e:
                with contextlib.suppress(Exception):
                    ray.shutdown()
                self._end()
                if attempt == self.ATTEMPTS:
                    raise RuntimeError(f"Ray did not start ({attempt} attempts in {time.monotonic() - t0:.0f} s): "
                                       f"{e}") from e
                self.say(f"Ray did not start ({type(e).__name__}: {e}); trying again")
            except BaseException:       # a signal: nothing is left behind
                with contextlib.suppress(Exception):
                    ray.shutdown()
                self._end()
                raise
        if not self._atexit:        # a process that ends without stop() still ends its Ray
            atexit.register(self.stop)
            self._atexit = True
        self.say(f"Ray started in {time.monotonic() - t0:.1f} s ({self.session_dir})")
        return self

    def _start_node(self) -> None:
        from ray._private.node import Node
        from ray._private.parameter import RayParams

        class _Node(Node):
            def start_api_server(self, *, include_dashboard: bool | None, raise_on_failure: bool) -> None:
                """Not started: with include_dashboard=False it would serve usage statistics alone
                (not collected here), and Node waits up to 60 s for it before it starts the raylet."""

        system_config = {"worker_register_timeout_seconds": self.WORKER_REGISTER_TIMEOUT_S,
                         "enable_metrics_collection": False, "prestart_worker_first_driver": False,
                         "worker_niceness": 0}
        self._as_ray_init(system_config)
        params = RayParams(node_ip_address="127.0.0.1", num_cpus=self.num_cpus, include_dashboard=False,
                           dashboard_host="127.0.0.1", dashboard_port=None, no_monitor=True,
                           include_log_monitor=self.log_to_driver, min_worker_port=0, max_worker_port=0,
                           _system_config=system_config, **agent_ports())
        self.owner = f"{os.getpid()}:{uuid.uuid4().hex}"
        before = os.environ.get(OWNER_ENV)
        os.environ[OWNER_ENV] = self.owner      # inherited by what the node starts, and by what that starts
        try:
            # on this (the calling) thread: the node's processes die with the thread that started them
            with raylets_told_agent_ports():
                self.node = _Node(params, head=True, shutdown_at_exit=False, spawn_reaper=True, ray_init_cluster=True)
        finally:
            if before is None:
                os.environ.pop(OWNER_ENV, None)
            else:
                os.environ[OWNER_ENV] = before
        self.session_dir = self.node.get_session_dir_path()

    def _as_ray_init(self, system_config: dict) -> None:
        """What ray.init does before it starts a node (Ray 2.60); each part skipped on a Ray without it."""
        from ray._private import ray_constants
        from ray._private.ray_logging import setup_logger

        setup_logger(self.logging_level, ray_constants.LOGGER_FORMAT)
        with contextlib.suppress(ImportError):
            from ray._common.usage import usage_lib

            if not usage_lib.is_nightly_wheel():
                usage_lib.set_usage_stats_enabled_via_env_var(False)
        try:
            from ray._private.authentication.authentication_token_setup import (
                enable_token_auth_by_default,
                ensure_token_if_auth_enabled,
            )
        except ImportError:
            return
        enable_token_auth_by_default()
        ensure_token_if_auth_enabled(system_config, create_token_if_missing=True)

    def check(self) -> None:
        """Raise if the node's GCS or raylet has exited (a step waiting on them would wait in vain)."""
        if self.node is None:
            return
        for kind, proc in self.node.dead_processes():
            if kind in ("gcs_server", "raylet"):
                raise RuntimeError(f"Ray's {kind} exited (code {proc.returncode}); see {self.session_dir}/logs")

    def processes(self) -> list:
        """The live processes carrying this node's mark (any parent), this one aside."""
        import psutil

        if not self.owner:
            return []
        found = []
        for p in psutil.process_iter():
            if p.pid == os.getpid():
                continue
            with contextlib.suppress(psutil.Error, OSError):
                if p.environ().get(OWNER_ENV) == self.owner and p.status() != psutil.STATUS_ZOMBIE:
                    found.append(p)
        return found

    def stop(self) -> list:
        """Disconnect, end the node and everything it started; what is left (normally nothing)."""
        import ray

        if self._atexit:
            atexit.unregister(self.stop)
            self._atexit = False
        if self.node is None and not self.owner:
            return []
        t0 = time.monotonic()
        with contextlib.suppress(Exception):
            ray.shutdown()
        left = self._end()
        self.say(f"Ray stopped in {time.monotonic() - t0:.1f} s" + (f"; {len(left)} process(es) still there: "
                                                                    f"{[p.pid for p in left]}" if left else ""))
        return left

    def _end(self) -> list:
        import psutil

        node, self.node = self.node, None
        tree: list = []
        if node is not None:
            # the node's processes and all they started, seen before they go (a process renamed
            # by setproctitle, as Ray's agents are, may not show its environment, so its mark)
            for infos in list(node.all_processes.values()):
                for info in infos:
                    with contextlib.suppress(psutil.Error):
                        p = psutil.Process(info.process.pid)
                        tree += [p, *p.children(recursive=True)]
            with contextlib.suppress(Exception):
                node.kill_all_processes(check_alive=False, allow_graceful=True, wait=True)
        # the raylet's children end once they see it gone; what has not after the grace is killed
        deadline = time.monotonic() + self.STOP_GRACE_S
        left = list({p.pid: p for p in tree + self.processes() if p.pid != os.getpid() and _alive(p)}.values())
        while left and time.monotonic() < deadline:
            time.sleep(0.2)
            left = [p for p in left if _alive(p)]
        if left:
            names = sorted({_name(p) for p in left})
            self.say(f"killing {len(left)} process(es) of this Ray still running {self.STOP_GRACE_S:g} s after it "
                     f"stopped: {', '.join(names)}")
            for p in left:
                with contextlib.suppress(psutil.Error):
                    p.kill()
            _gone, left = psutil.wait_procs(left, timeout=5)
        self.owner = ""
        return left


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


def _alive(p: Any) -> bool:
    import psutil

    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _name(p: Any) -> str:
    try:
        return p.name() if not p.cmdline() or not p.cmdline()[0].startswith("ray::") else p.cmdline()[0]
    except Exception:       # noqa: BLE001 - gone meanwhile
        return str(p.pid)


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
                with _signal_handlers_kept():
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

    def _start_serve(self, serve: Any, ray: Any) -> None:
        options = {"http_options": {"host": self.host, "port": self.port}, "logging_config": {"log_level": "WARNING"},
                   **({"proxy_location": self.proxy_location} if self.proxy_location else {})}
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
            if not serve.status().applications:
                serve.shutdown()        # Serve's own actors too, when nothing else of anyone's runs on it
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
