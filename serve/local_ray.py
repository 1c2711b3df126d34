"""A Ray of this process's own for `xg2 serve` and the tests: on the loopback, only the
components a Serve application needs, started so that a busy machine makes the start slower, not a
failure, and stopped with every process it started (see LocalRay)."""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import signal
import socket
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

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
def signal_handlers_kept():
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
                try:
                    self._start_node()
                except (ImportError, AttributeError, TypeError) as e:
                    # Ray's private start API (ray._private.node) is not the one this was written
                    # for (Ray 2.60): its own ray.init, which may time out on a busy machine
                    self._end()
                    self.say(f"this Ray ({getattr(ray, '__version__', '?')}) starts its node another way "
                             f"({type(e).__name__}: {e}); starting it with ray.init")
                    self._start_plain()
                    break
                with signal_handlers_kept():
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

    def _start_plain(self) -> None:
        """ray.init's own local node (no dashboard, on the loopback), its processes marked as
        _start_node's are, so that stop() still finds them all."""
        import ray

        self.owner = f"{os.getpid()}:{uuid.uuid4().hex}"
        before = os.environ.get(OWNER_ENV)
        os.environ[OWNER_ENV] = self.owner
        try:
            with signal_handlers_kept():
                ray.init(address="local", include_dashboard=False, _node_ip_address="127.0.0.1",
                         num_cpus=self.num_cpus, namespace=self.namespace, logging_level=self.logging_level,
                         log_to_driver=self.log_to_driver)
        finally:
            if before is None:
                os.environ.pop(OWNER_ENV, None)
            else:
                os.environ[OWNER_ENV] = before
        with contextlib.suppress(Exception):
            self.session_dir = ray._private.worker._global_node.get_session_dir_path()

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
