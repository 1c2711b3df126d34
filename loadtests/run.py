"""A headless multi-tenant load run (issue 18): start the application (or target `--url`), run
loadtests/locustfile.py with locust in a child process for a bounded time, sample the replica's
statistics, the cache shards and the resident memory of the application's processes meanwhile,
optionally kill a cache shard and a model replica under load, and write a summary and a plot.

    python loadtests/run.py [--duration S] [--users N] [--spawn-rate R] [--model tiny|default]
                            [--url URL] [--kill-shard] [--kill-replica] [--json FILE] [--csv PREFIX]
                            [--shape step|soak] [--out DIR]

Locust (gevent) runs as a subprocess: gevent must not be imported into the process that runs Ray
and the application. The child reports every request (outcome, latency, time to first token,
tokens) as JSON lines; this process reads them with locust's CSV files at the end. Everything is
on the loopback, bounded in users, spawn rate and time, and stops by itself (the child is killed
if it outlives its time).

`run_load(...)` is the same from Python (the tests call it); it returns the summary.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import itertools
import json
import math
import os
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
LOCUSTFILE = HERE / "locustfile.py"

FAILURE_KINDS = ("invalid_output", "http_4xx", "http_5xx", "timeout", "connection", "stream_error")
#: The summary's fields the issue names (the tests check them all).
REQUIRED_FIELDS = ("requests", "failed_requests", "invalid_outputs", "p50_ms", "p99_ms", "ttft_p50_ms",
                   "tokens_per_s", "cache_hit_rate", "rss_mb", "module_hit_rate", "entry_hit_rate",
                   "grammar_hit_rate", "compile_cpu_ms_per_request")
#: Serve and xg2 processes by their Ray process titles.
ROLES = (("ray::ServeReplica:xg2:xg2-model", "replica"), ("ray::CacheShard", "shard"),
         ("ray::ServeReplica:xg2-masks", "masks"), ("ray::ProxyActor", "proxy"),
         ("ray::ServeController", "controller"), ("ray::ServeReplica:xg2-shards", "shard_keeper"),
         ("ray::ServeReplica:xg2:xg2-ingress", "ingress"), ("ray::MaskHost", "masks"))
#: Processes told by a part of their command line: the compile workers (children of a replica or
#: of the mask service).
ROLES_IN = (("xg2.actors.compile_workers import _serve", "compile_worker"), ("-m locust", "locust"),
            ("/raylet", "ray_system"), ("gcs_server", "ray_system"))
#: Positions allowed a sequence by the model, for the tools' prompt budget (estimated tokens).
PROMPT_BUDGETS = {"tiny": 2000, "default": 3600}


def say(msg: str) -> None:
    print(f"[loadtest {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def quantile(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    k = (len(xs) - 1) * q
    lo, hi = math.floor(k), math.ceil(k)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def _r(x: float | None, nd: int = 1) -> float | None:
    return None if x is None else round(x, nd)


# ------------------------------------------------------------------------------------------------
# Processes and their memory
# ------------------------------------------------------------------------------------------------

def _descendants() -> list[tuple[int, str, float, float]]:
    """(pid, title, rss MB, CPU seconds) of this process's descendants (the Ray it started: its
    raylet's workers; the locust child), by psutil when installed, else /proc."""
    try:
        import psutil
    except ImportError:
        psutil = None
    out = []
    if psutil is not None:
        for p in psutil.Process().children(recursive=True):
            with contextlib.suppress(psutil.Error):
                cpu = p.cpu_times()
                out.append((p.pid, " ".join(p.cmdline()), p.memory_info().rss / 2**20, cpu.user + cpu.system))
        return out
    parents: dict[int, int] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                stat = (d / "stat").read_text()
                parents[int(d.name)] = int(stat[stat.rindex(")") + 2:].split()[1])
    mine, frontier = set(), {os.getpid()}
    while frontier:
        frontier = {pid for pid, ppid in parents.items() if ppid in frontier and pid not in mine}
        mine |= frontier
    tick = os.sysconf("SC_CLK_TCK")
    for pid in mine:
        with contextlib.suppress(OSError, ValueError, IndexError):
            title = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
            rss = next(int(line.split()[1]) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                       if line.startswith("VmRSS:"))
            stat = Path(f"/proc/{pid}/stat").read_text()
            fields = stat[stat.rindex(")") + 2:].split()
            out.append((pid, title, rss / 1024, (int(fields[11]) + int(fields[12])) / tick))
    return out


def app_processes() -> dict[int, tuple[str, float, float]]:
    """pid -> (role, rss MB, CPU seconds) of the application's processes (and the load generator)
    among this process's descendants."""
    out = {}
    for pid, title, rss, cpu in _descendants():
        for prefix, role in ROLES:
            if title.startswith(prefix):
                out[pid] = (role, rss, cpu)
                break
        else:
            for part, role in ROLES_IN:
                if part in title:
                    out[pid] = (role, rss, cpu)
                    break
    return out


# ------------------------------------------------------------------------------------------------
# The replicas' statistics
# ------------------------------------------------------------------------------------------------

#: What the replicas' compiles found where (GrammarRuntime.reuse), summed like the other counters.
REUSE_FIELDS = ("modules_local", "modules_shards", "modules_lowered", "entries_needed", "entries_local",
                "entries_shards", "compile_cpu_ms", "grammar_opens")


def _counters(stats: dict) -> dict[str, float]:
    rt = stats.get("runtime") or {}
    reuse = stats.get("reuse") or {}
    return {"hits_local": rt.get("grammar_hits", 0), "hits_shards": rt.get("tier_grammar_hits", 0),
            "compiled": rt.get("compiles", 0) - rt.get("tier_grammar_hits", 0), "shared": rt.get("compile_shared", 0),
            "requests": (stats.get("requests") or {}).get("requests", 0),
            "failed": (stats.get("requests") or {}).get("failed", 0),
            **{k: reuse.get(k, 0) for k in REUSE_FIELDS}}


def reuse_rates(c: dict[str, float]) -> dict[str, float | None]:
    """Module, first-mask entry and grammar hit rates (local or from the shards, over lookups) and
    the compile CPU per grammar request, of summed counters."""
    modules = c.get("modules_local", 0) + c.get("modules_shards", 0) + c.get("modules_lowered", 0)
    entries = c.get("entries_needed", 0)
    opens = c.get("grammar_opens", 0)
    return {"module_hit_rate": _r((c.get("modules_local", 0) + c.get("modules_shards", 0)) / modules, 3)
            if modules else None,
            "entry_hit_rate": _r((c.get("entries_local", 0) + c.get("entries_shards", 0)) / entries, 3)
            if entries else None,
            "grammar_hit_rate": _r(hit_rate(c), 3),
            "compile_cpu_ms_per_request": _r(c.get("compile_cpu_ms", 0) / opens, 2) if opens else None,
            "modules": modules, "modules_from_shards": c.get("modules_shards", 0)}


class ReplicaTracker:
    """/v1/xg2/stats is the answering replica's: samples are matched to it by its replica id, or
    (an older server that does not say it) to the replica whose counters they continue (all at
    least as large, least apart), else counted as a new (or restarted) replica."""

    def __init__(self) -> None:
        self.replicas: list[dict[str, float]] = []
        self.ids: dict[str, int] = {}
        self.totals_seen: dict[str, float] = defaultdict(int)

    def add(self, stats: dict) -> tuple[int, dict[str, float]]:
        c = _counters(stats)
        best, gap = None, None
        rid = (stats.get("replica") or {}).get("id")
        if rid is not None:
            best = self.ids.get(rid)
            if best is None:
                self.replicas.append({k: 0 for k in c})
                best = self.ids[rid] = len(self.replicas) - 1
        for i, prev in enumerate(self.replicas if rid is None else ()):
            if all(c[k] >= prev[k] for k in c):
                d = sum(c[k] - prev[k] for k in c)
                if gap is None or d < gap:
                    best, gap = i, d
        if best is None:
            self.replicas.append({k: 0 for k in c})
            best = len(self.replicas) - 1
        delta = {k: c[k] - self.replicas[best][k] for k in c}
        self.replicas[best] = c
        for k, v in delta.items():
            self.totals_seen[k] += v
        return best, delta


def hit_rate(c: dict[str, int]) -> float | None:
    """Grammars found (this replica's cache or the shards) over grammars needed (found or
    compiled); a request that joined a compile in flight is neither."""
    hits = c.get("hits_local", 0) + c.get("hits_shards", 0)
    n = hits + c.get("compiled", 0)
    return hits / n if n else None


class Sampler(threading.Thread):
    """Every `every` seconds: GET /v1/xg2/stats, the shards' statistics (through Ray, when this
    process runs the application) and the resident memory of the application's processes."""

    def __init__(self, base: str, every: float, shard_names: list[str] | None, t0: float,
                 stats_key: str | None = None):
        super().__init__(daemon=True, name="loadtest-sampler")
        self.base, self.every, self.shard_names, self.t0 = base, every, shard_names, t0
        # an admin key reads every tenant's figures; any other key, the replica's and its own
        self.headers = {"Authorization": f"Bearer {stats_key or 'loadtest-sampler'}"}
        self.samples: list[dict] = []
        self.recent: dict[tuple, dict] = {}
        self.tracker = ReplicaTracker()
        self.stop_event = threading.Event()

    def run(self) -> None:
        while not self.stop_event.is_set():
            with contextlib.suppress(Exception):
                self.sample()
            self.stop_event.wait(self.every)

    def sample(self) -> dict:
        s: dict[str, Any] = {"t": time.time()}
        try:
            request = urllib.request.Request(f"{self.base}/v1/xg2/stats", headers=self.headers)
            with urllib.request.urlopen(request, timeout=5) as r:
                stats = json.loads(r.read())
            idx, delta = self.tracker.add(stats)
            s["replica"] = idx
            s["window"] = delta
            s["counters"] = dict(self.tracker.totals_seen)
            cb = stats.get("cache_bytes") or {}
            s["cache_bytes"] = {"grammars": cb.get("grammars", 0), "compiler": cb.get("compiler", 0)}
            s["tier"] = stats.get("tier")
            s["open_sessions"] = stats.get("open_sessions")
            s["steps"] = stats.get("steps")
            s["compile_usage"] = stats.get("compile_usage")
            s["compile_budget_refused"] = (stats.get("runtime") or {}).get("compile_budget_refused")
            for rec in stats.get("recent") or ():
                self.recent[(rec.get("tenant"), rec.get("total_ms"), rec.get("ttft_ms"))] = rec
        except Exception as e:      # noqa: BLE001 - a sample that failed is recorded as such
            s["stats_error"] = f"{type(e).__name__}: {str(e)[:120]}"
        if self.shard_names:
            s["shards"] = self._shards()
        procs = app_processes()
        s["rss"] = {f"{role}:{pid}": round(mb, 1) for pid, (role, mb, _) in procs.items()}
        s["cpu_s"] = {f"{role}:{pid}": round(cpu, 2) for pid, (role, _, cpu) in procs.items()}
        self.samples.append(s)
        return s

    def _shards(self) -> list[dict]:
        import ray

        out = []
        for name in self.shard_names:
            try:
                h = ray.get_actor(name, namespace="xg2")
                st = ray.get(h.stats.remote(), timeout=3)
                out.append({"name": name, "items": st["items"], "bytes": st["bytes"],
                            "incarnation": st["incarnation"], "hits": st["hits"], "misses": st["misses"]})
            except Exception as e:      # noqa: BLE001 - a shard restarting
                out.append({"name": name, "error": type(e).__name__})
        return out


# ------------------------------------------------------------------------------------------------
# Faults
# ------------------------------------------------------------------------------------------------

def kill_shard(name: str) -> dict:
    """Kill the cache shard actor `name` (namespace "xg2"; Ray restarts it, empty) and time its
    restart (a ping answered by another process)."""
    import ray

    h = ray.get_actor(name, namespace="xg2")
    pid = ray.get(h.ping.remote(), timeout=10)
    t = time.time()
    ray.kill(h, no_restart=False)
    fault = {"kind": "shard", "target": name, "t": t, "pid": pid}

    def watch() -> None:
        deadline = time.time() + 120
        while time.time() < deadline:
            try:
                new = ray.get(ray.get_actor(name, namespace="xg2").ping.remote(), timeout=5)
                if new != pid:
                    fault["restarted_after_s"] = round(time.time() - t, 2)
                    fault["new_pid"] = new
                    return
            except Exception:       # noqa: BLE001, S110 - restarting
                pass
            time.sleep(0.2)

    threading.Thread(target=watch, daemon=True).start()
    return fault


def serve_actors(*parts: str) -> list[str]:
    """The names of Serve's actors (namespace "serve") whose name holds every one of `parts`."""
    import ray

    return sorted(a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
                  if a.get("namespace") == "serve" and all(p in a["name"] for p in parts))


def model_replicas() -> list[str]:
    """The names of the model deployment's replica actors."""
    return serve_actors("xg2-model", "REPLICA")


def kill_replica() -> dict:
    """Kill one model replica (Serve starts another) and time the new replica's appearance."""
    import ray

    before = model_replicas()
    if not before:
        return {"kind": "replica", "error": "no model replica found", "t": time.time()}
    name = before[0]
    t = time.time()
    ray.kill(ray.get_actor(name, namespace="serve"), no_restart=False)
    fault = {"kind": "replica", "target": name, "t": t, "replicas_before": len(before)}

    def watch() -> None:
        deadline = time.time() + 180
        while time.time() < deadline:
            with contextlib.suppress(Exception):
                now = model_replicas()
                if any(n not in before for n in now):
                    fault["replaced_after_s"] = round(time.time() - t, 2)
                    return
                if name in now and len(now) == len(before):
                    # restarted in place under its name: ask it (through Ray) whether it is up
                    with contextlib.suppress(Exception):
                        h = ray.get_actor(name, namespace="serve")
                        ray.get(h.__ray_ready__.remote(), timeout=2)
                        if time.time() - t > 1.0:
                            fault["restarted_after_s"] = round(time.time() - t, 2)
                            return
            time.sleep(0.5)

    threading.Thread(target=watch, daemon=True).start()
    return fault


def restart_ingress(base: str) -> dict:
    """Kill Serve's HTTP proxy (the controller starts another) and time until the ingress answers
    again: connections in flight are cut, new ones refused until then."""
    import ray

    names = serve_actors("PROXY")      # Serve's HTTP proxies: the ingress every request enters by
    if not names:
        return {"kind": "ingress", "error": "no Serve proxy actor found", "t": time.time()}
    name = names[0]
    handle = ray.get_actor(name, namespace="serve")
    t = time.time()
    ray.kill(handle, no_restart=False)
    fault = {"kind": "ingress", "target": name, "t": t}

    def watch() -> None:
        deadline = time.time() + 180
        time.sleep(0.5)
        while time.time() < deadline:
            with contextlib.suppress(Exception), urllib.request.urlopen(base + "/-/healthz", timeout=2) as r:
                if r.status == 200:
                    fault["restarted_after_s"] = round(time.time() - t, 2)
                    return
            time.sleep(0.25)

    threading.Thread(target=watch, daemon=True).start()
    return fault


# ------------------------------------------------------------------------------------------------
# The child locust process
# ------------------------------------------------------------------------------------------------

def locust_command(host: str, users: int, spawn_rate: float, duration: int, csv_prefix: str,
                   stop_timeout: int) -> list[str]:
    return [sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--headless", "-u", str(users),
            "-r", str(spawn_rate), "-t", f"{duration}s", "--host", host, "--csv", csv_prefix, "--only-summary",
            "--stop-timeout", str(stop_timeout), "--loglevel", "WARNING", "--exit-code-on-error", "0"]


def read_events(path: Path) -> list[dict]:
    out = []
    if path.exists():
        with open(path, encoding="utf-8") as f:
            for line in f:
                with contextlib.suppress(ValueError):
                    out.append(json.loads(line))
    return out


def _wait_start(path: Path, proc: subprocess.Popen, timeout_s: float) -> float | None:
    """The time the locust child's test started (its first JSON line), or None if it exited."""
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        for rec in read_events(path):
            if rec.get("type") == "start":
                return rec["t"]
        if proc.poll() is not None:
            return None
        time.sleep(0.5)
    return None


def _stop_child(proc: subprocess.Popen) -> None:
    """End the locust child (its own process group, by its pid), politely then not."""
    if proc.poll() is not None:
        return
    for sig, wait in ((signal.SIGINT, 15), (signal.SIGTERM, 5), (signal.SIGKILL, 5)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue


# ------------------------------------------------------------------------------------------------
# The summary
# ------------------------------------------------------------------------------------------------

def _locust_csv(prefix: str) -> dict:
    out: dict[str, Any] = {}
    stats = Path(f"{prefix}_stats.csv")
    if stats.exists():
        with open(stats, newline="") as f:
            for row in csv.DictReader(f):
                if row.get("Name") == "Aggregated":
                    out["aggregated"] = {k: row.get(k) for k in ("Request Count", "Failure Count", "50%", "95%",
                                                                 "99%", "Requests/s")}
    failures = Path(f"{prefix}_failures.csv")
    if failures.exists():
        with open(failures, newline="") as f:
            out["failures"] = [{"name": r.get("Name"), "error": (r.get("Error") or "")[:200],
                                "occurrences": int(r.get("Occurrences") or 0)} for r in csv.DictReader(f)]
    # exceptions raised inside the users' tasks: requests that were never sent (a bug of the load
    # generator, which would otherwise only thin out what was measured)
    exceptions = Path(f"{prefix}_exceptions.csv")
    out["client_exceptions"] = []
    if exceptions.exists():
        with open(exceptions, newline="") as f:
            out["client_exceptions"] = [{"count": int(r.get("Count") or 0), "message": (r.get("Message") or "")[:200]}
                                        for r in csv.DictReader(f)]
    return out


def _window_stats(reqs: list[dict], lo: float, hi: float) -> dict:
    done = [r for r in reqs if lo <= r["t"] < hi]
    ms = [r["ms"] for r in done if r["kind"] in ("ok", "truncated")]
    return {"requests": len(done), "failed": sum(r["kind"] in FAILURE_KINDS or r["kind"] == "retried" for r in done),
            "p50_ms": _r(quantile(ms, 0.5)), "p99_ms": _r(quantile(ms, 0.99))}


def _windows_since(samples: list[dict], t: float) -> Counter:
    """The counters' changes seen by the samples taken after `t`, summed."""
    out: Counter = Counter()
    for s in samples:
        if "window" in s and s["t"] >= t:
            out.update(s["window"])
    return out


def _series_hit_rate(samples: list[dict], t0: float, bucket_s: float) -> list[dict]:
    """The hit rate per time bucket (the windows of the samples in it, summed) and cumulative."""
    out = []
    buckets: dict[int, Counter] = defaultdict(Counter)
    for s in samples:
        if "window" in s:
            buckets[int((s["t"] - t0) // bucket_s)].update(s["window"])
    for b in sorted(buckets):
        cum = next(s["counters"] for s in reversed(samples) if "counters" in s and int((s["t"] - t0) // bucket_s) <= b)
        out.append({"t": round((b + 1) * bucket_s, 1), "window": _r(hit_rate(buckets[b]), 3),
                    "cumulative": _r(hit_rate(cum), 3)})
    return out


def _new_process_after(samples: list[dict], role: str, t: float) -> float | None:
    """Seconds from `t` to the first sample showing a process of `role` not seen before `t`."""
    before = {k for s in samples if s["t"] < t for k in (s.get("rss") or {}) if k.startswith(role + ":")}
    for s in samples:
        if s["t"] >= t and any(k.startswith(role + ":") and k not in before for k in s.get("rss") or {}):
            return round(s["t"] - t, 1)
    return None


def _fault_cost(f: dict, attempts: list[dict], samples: list[dict], t0: float, until: float) -> dict:
    """What a fault cost: the requests in flight when it struck, failures and retries until
    `until` (the next fault, or 60 s), the first success, latency and compiles before and after,
    the hit rate's recovery, and when the actor was back."""
    t = f["t"]
    until = min(until, t + 60)
    in_flight = [r for r in attempts if r["start"] < t < r["t"]]
    after = [r for r in attempts if r["t"] >= t]
    first_ok = min((r["t"] for r in after if r["start"] >= t and r["kind"] in ("ok", "truncated")), default=None)
    bad_after = [r for r in after if (r["kind"] in FAILURE_KINDS or r["kind"] == "retried") and r["t"] < until]
    out = {"kind": f["kind"], "target": f.get("target"), "at_s": round(t - t0, 1), "error": f.get("error"),
           "restarted_after_s": f.get("restarted_after_s"), "replaced_after_s": f.get("replaced_after_s"),
           "new_process_seen_after_s": _new_process_after(samples, f["kind"], t),
           "in_flight": len(in_flight),
           "in_flight_outcomes": dict(Counter(r["kind"] for r in in_flight)),
           "in_flight_max_ms": _r(max((r["ms"] for r in in_flight), default=None)),
           "first_success_after_s": _r(None if first_ok is None else first_ok - t, 2),
           "failed_or_retried_after": dict(Counter(r["kind"] if r["kind"] != "retried" else f"retried({r['cause']})"
                                                   for r in bad_after)),
           "last_failure_after_s": _r(max((r["t"] - t for r in bad_after), default=None), 2),
           "before_10s": _window_stats(attempts, t - 10, t), "after_10s": _window_stats(attempts, t, t + 10)}
    # the hit rate: the mean of the windows in the 15 s before, and when a window after reaches 90% of it
    win = [(s["t"], hit_rate(s["window"])) for s in samples if "window" in s and sum(s["window"].values())]
    pre = [h for ts, h in win if t - 15 <= ts < t and h is not None]
    if pre:
        level = statistics.mean(pre)
        out["hit_rate_before"] = round(level, 3)
        rec = next((ts for ts, h in win if ts > t and h is not None and h >= 0.9 * level), None)
        out["hit_rate_recovered_after_s"] = _r(None if rec is None else rec - t, 1)
    # compiles in the 15 s after against the 15 s before (grammars the fault made us build again)
    def compiles(lo: float, hi: float) -> int:
        return sum(s["window"].get("compiled", 0) for s in samples if "window" in s and lo <= s["t"] < hi)
    out["compiles_15s_before"], out["compiles_15s_after"] = compiles(t - 15, t), compiles(t, t + 15)
    return out


def _steps(attempts: list[dict], t0: float, users: int, step_users: int, step_s: float, t_end: float) -> dict:
    rows = []
    k = 0
    while t0 + (k + 0.5) * step_s <= t_end:       # a last window shorter than half a step is left out
        lo, hi = t0 + k * step_s, min(t0 + (k + 1) * step_s, t_end)
        done = [r for r in attempts if lo <= r["t"] < hi and r["kind"] in ("ok", "truncated")]
        ms = [r["ms"] for r in done]
        toks = sum(r.get("tokens") or 0 for r in done)
        rows.append({"users": min(users, step_users * (k + 1)), "from_s": round(lo - t0, 1),
                     "requests_per_s": round(len(done) / max(hi - lo, 1e-9), 2),
                     "tokens_per_s": round(toks / max(hi - lo, 1e-9), 1),
                     "p50_ms": _r(quantile(ms, 0.5)), "p99_ms": _r(quantile(ms, 0.99))})
        k += 1
    knee = None
    for a, b in itertools.pairwise(rows):
        if b["users"] > a["users"] and b["requests_per_s"] < 1.1 * a["requests_per_s"]:
            knee = a["users"]
            break
    return {"steps": rows, "knee_users": knee}


def summarize(events: list[dict], samples: list[dict], faults: list[dict], *, timeout_s: float,
              warmup_fraction: float = 0.25, shape: str | None = None, users: int = 0,
              step_users: int = 2, step_s: float = 30.0, recent: list[dict] | None = None) -> dict:
    start = next((e["t"] for e in events if e.get("type") == "start"), None)
    attempts = [e for e in events if e.get("type") == "request"]
    finals = [r for r in attempts if r["kind"] != "retried"]
    t0 = start if start is not None else min((r["start"] for r in attempts), default=time.time())
    t_end = max((r["t"] for r in attempts), default=t0)
    span = max(t_end - t0, 1e-9)
    kinds = Counter(r["kind"] for r in finals)
    ms = [r["ms"] for r in finals if r["kind"] in ("ok", "truncated")]
    ttft = [r["ttft_ms"] for r in finals if r.get("ttft_ms") is not None]
    server_ttft = [r["ttft_ms"] for r in (recent or []) if r.get("ttft_ms") is not None]
    tokens = sum(r.get("tokens") or 0 for r in finals if r["kind"] in ("ok", "truncated"))
    counters = next((s["counters"] for s in reversed(samples) if "counters" in s), {})
    by_name: dict[str, Counter] = defaultdict(Counter)
    by_user: dict[str, Counter] = defaultdict(Counter)
    for r in finals:
        by_name[r["name"]][r["kind"]] += 1
        by_user[r["user"]][r["kind"]] += 1
    tools = sorted(r["tools"] for r in finals if r.get("tools"))
    # memory: per role over time, and its change after warm-up
    rss_series = []
    for s in samples:
        roles: dict[str, float] = defaultdict(float)
        for key, mb in (s.get("rss") or {}).items():
            roles[key.split(":")[0]] += mb
        rss_series.append({"t": round(s["t"] - t0, 1), **{k: round(v, 1) for k, v in roles.items()},
                           "processes": s.get("rss") or {}})
    growth = {}
    warm = [r for r in rss_series if r["t"] >= warmup_fraction * span]
    if len(warm) >= 2:
        for role in ("replica", "shard", "compile_worker", "masks"):
            first, last = warm[0].get(role), warm[-1].get(role)
            if first:
                growth[role] = round((last - first) / first, 4) if last else None
    # CPU seconds spent by each role over the run (processes that died count up to their last sample)
    last_cpu: dict[str, float] = {}
    first_cpu: dict[str, float] = {}
    for s in samples:
        for key, cpu in (s.get("cpu_s") or {}).items():
            first_cpu.setdefault(key, cpu)
            last_cpu[key] = cpu
    cpu_by_role: dict[str, float] = defaultdict(float)
    for key, cpu in last_cpu.items():
        cpu_by_role[key.split(":")[0]] += cpu - first_cpu[key]
    cache_bytes = []
    for s in samples:
        if "cache_bytes" in s or "shards" in s:
            shards = [x for x in s.get("shards") or () if "bytes" in x]
            cache_bytes.append({"t": round(s["t"] - t0, 1), **(s.get("cache_bytes") or {}),
                                "shards": sum(x["bytes"] for x in shards) if "shards" in s else None,
                                "shard_items": sum(x["items"] for x in shards) if "shards" in s else None})
    latency_by_class = {}
    for user in sorted({r["user"] for r in finals}):
        xs = [r["ms"] for r in finals if r["user"] == user and r["kind"] in ("ok", "truncated", "refused")]
        latency_by_class[user] = {"n": len(xs), "p50_ms": _r(quantile(xs, 0.5)), "p99_ms": _r(quantile(xs, 0.99))}
    # the tenants that are not hostile: the figures a hostile tenant must not move
    others = [r for r in finals if r["user"] != "HostileTenant"]
    others_ms = [r["ms"] for r in others if r["kind"] in ("ok", "truncated")]
    others_ttft = [r["ttft_ms"] for r in others if r.get("ttft_ms") is not None]
    summary = {
        "requests": len(finals),
        "attempts": len(attempts),
        "failed_requests": sum(kinds[k] for k in FAILURE_KINDS),
        "invalid_outputs": kinds["invalid_output"],
        "timeouts": kinds["timeout"],
        "hung_requests": sum(1 for r in attempts if r["ms"] > timeout_s * 1e3 + 2000),
        "truncated": kinds["truncated"],
        "unsupported": kinds["unsupported"],
        "retried": sum(1 for r in attempts if r["kind"] == "retried"),
        "failures_by_kind": {k: kinds[k] for k in FAILURE_KINDS if kinds[k]},
        "retried_by_cause": dict(Counter(r.get("cause") for r in attempts if r["kind"] == "retried")),
        "duration_s": round(span, 1),
        "requests_per_s": round(len(finals) / span, 2),
        "p50_ms": _r(quantile(ms, 0.5)), "p95_ms": _r(quantile(ms, 0.95)), "p99_ms": _r(quantile(ms, 0.99)),
        "max_ms": _r(max(ms, default=None)),
        "ttft_p50_ms": _r(quantile(ttft, 0.5) if ttft else quantile(server_ttft, 0.5)),
        "ttft_p95_ms": _r(quantile(ttft, 0.95) if ttft else quantile(server_ttft, 0.95)),
        "ttft_source": "streamed requests" if ttft else ("replica recent" if server_ttft else None),
        "ttft_server_p50_ms": _r(quantile(server_ttft, 0.5)),
        "completion_tokens": tokens,
        "tokens_per_s": round(tokens / span, 1),
        "cache_hit_rate": _r(hit_rate(counters), 3),
        "cache_hits_by_tier": {"local": counters.get("hits_local", 0), "shards": counters.get("hits_shards", 0),
                               "compiled": counters.get("compiled", 0),
                               "joined_compile_in_flight": counters.get("shared", 0)},
        "cache_hit_rate_over_time": _series_hit_rate(samples, t0, 10.0),
        **{k: v for k, v in reuse_rates(counters).items() if k.endswith(("_rate", "_per_request"))},
        "reuse": reuse_rates(counters),
        "reuse_last_third": reuse_rates(_windows_since(samples, t0 + 2 * span / 3)),
        "cache_bytes": cache_bytes,
        "rss_mb": [{k: v for k, v in r.items() if k != "processes"} for r in rss_series],
        "rss_mb_processes": [{"t": r["t"], **r["processes"]} for r in rss_series],
        "rss_growth_after_warmup": growth,
        "cpu_s_by_role": {k: round(v, 1) for k, v in sorted(cpu_by_role.items())},
        "outcomes_by_name": {k: dict(v) for k, v in sorted(by_name.items())},
        "outcomes_by_class": {k: dict(v) for k, v in sorted(by_user.items())},
        "latency_by_class": latency_by_class,
        "others": {"requests": len(others), "failed_requests": sum(1 for r in others if r["kind"] in FAILURE_KINDS),
                   "p50_ms": _r(quantile(others_ms, 0.5)), "p95_ms": _r(quantile(others_ms, 0.95)),
                   "p99_ms": _r(quantile(others_ms, 0.99)), "ttft_p50_ms": _r(quantile(others_ttft, 0.5)),
                   "ttft_p99_ms": _r(quantile(others_ttft, 0.99))},
        "refused": kinds["refused"],
        "tools_per_request": {"min": tools[0], "median": tools[len(tools) // 2], "max": tools[-1]} if tools else None,
        "tool_sets_seen": len({r["tool_set"] for r in finals if "tool_set" in r}),
        "schemas_seen": len({r["schema"] for r in finals if "schema" in r}),
        "tenants": len({r["tenant"] for r in finals}),
        "invalid_samples": [{"name": r["name"], "msg": r.get("msg")} for r in finals if r["kind"] == "invalid_output"][:20],
        "failure_samples": [{"name": r["name"], "kind": r["kind"], "status": r.get("status"), "msg": r.get("msg")}
                            for r in attempts if r["kind"] in FAILURE_KINDS[1:] or r["kind"] == "retried"][:20],
        "faults": [_fault_cost(f, attempts, samples, t0, nxt["t"] if nxt else t_end + 1)
                   for f, nxt in zip(faults, [*faults[1:], None])],
        "stats_errors": sum(1 for s in samples if "stats_error" in s),
    }
    if shape == "step":
        summary["step"] = _steps(attempts, t0, users, step_users, step_s, t_end)
    return summary


def print_summary(s: dict, out: Any = sys.stdout) -> None:
    def p(*a: Any) -> None:
        print(*a, file=out)

    p(f"\n== load test: {s['requests']} requests in {s['duration_s']} s ({s['requests_per_s']}/s), "
      f"{s['tenants']} tenants ==")
    p(f"failed requests: {s['failed_requests']} {s['failures_by_kind'] or ''}   invalid outputs: {s['invalid_outputs']}"
      f"   hung: {s['hung_requests']}   retried attempts: {s['retried']} {s['retried_by_cause'] or ''}")
    p(f"truncated (cut at max_tokens): {s['truncated']}   unsupported schemas: {s['unsupported']}")
    p(f"latency p50 {s['p50_ms']} ms, p95 {s['p95_ms']} ms, p99 {s['p99_ms']} ms, max {s['max_ms']} ms; "
      f"time to first token p50 {s['ttft_p50_ms']} ms ({s['ttft_source']}), server-side p50 {s['ttft_server_p50_ms']} ms")
    p(f"output tokens/s: {s['tokens_per_s']}   tools per request: {s['tools_per_request']}   "
      f"tool sets: {s['tool_sets_seen']}, schemas: {s['schemas_seen']}")
    hr = s["cache_hit_rate_over_time"]
    p(f"cache hit rate: {s['cache_hit_rate']} (by tier {s['cache_hits_by_tier']}); over time "
      + " ".join(f"{h['t']:.0f}s:{h['window']}" for h in hr))
    last = s["reuse_last_third"]
    p(f"reuse: modules {s['module_hit_rate']} (last third {last['module_hit_rate']}), first-mask entries "
      f"{s['entry_hit_rate']} (last third {last['entry_hit_rate']}), grammars {s['grammar_hit_rate']}; "
      f"compile CPU {s['compile_cpu_ms_per_request']} ms a request (last third {last['compile_cpu_ms_per_request']})")
    if s["cache_bytes"]:
        a, b = s["cache_bytes"][0], s["cache_bytes"][-1]
        p(f"cache bytes: replica grammars {a.get('grammars', 0) >> 10} -> {b.get('grammars', 0) >> 10} KiB, compiler "
          f"{a.get('compiler', 0) >> 10} -> {b.get('compiler', 0) >> 10} KiB"
          + (f", shards {a['shards'] >> 10} -> {b['shards'] >> 10} KiB ({b['shard_items']} items)"
             if b["shards"] is not None else ""))
    if s["rss_mb"]:
        a, b = s["rss_mb"][0], s["rss_mb"][-1]
        roles = [k for k in b if k != "t"]
        p("resident memory (MB): " + ", ".join(f"{k} {a.get(k)} -> {b.get(k)}" for k in roles)
          + f"; growth after warm-up {s['rss_growth_after_warmup']}")
    for e in (s.get("locust") or {}).get("client_exceptions") or ():
        p(f"EXCEPTION in the load generator ({e['count']} times; those requests were not sent): {e['message']}")
    if s["cpu_s_by_role"]:
        p("CPU seconds by role: " + ", ".join(f"{k} {v}" for k, v in s["cpu_s_by_role"].items()))
    for name, kinds in s["outcomes_by_name"].items():
        p(f"  {name:<28} {kinds}")
    p("latency by class: " + ", ".join(f"{k} p50 {v['p50_ms']} p99 {v['p99_ms']} ms (n {v['n']})"
                                       for k, v in s["latency_by_class"].items()))
    if "HostileTenant" in s["latency_by_class"]:
        o = s["others"]
        p(f"the other tenants: {o['requests']} requests, {o['failed_requests']} failed, p50 {o['p50_ms']} ms, "
          f"p99 {o['p99_ms']} ms, time to first token p50 {o['ttft_p50_ms']} p99 {o['ttft_p99_ms']} ms")
    for f in s["faults"]:
        if f.get("error"):
            p(f"fault: {f['kind']} not made: {f['error']}")
            continue
        back = f["restarted_after_s"] if f["restarted_after_s"] is not None else f["replaced_after_s"]
        p(f"fault: {f['kind']} {f['target']} at {f['at_s']} s: back after {back} s (new process seen after "
          f"{f['new_process_seen_after_s']} s); "
          f"in flight {f['in_flight']} {f['in_flight_outcomes']} (longest {f['in_flight_max_ms']} ms); "
          f"first success after {f['first_success_after_s']} s; failures/retries after "
          f"{f['failed_or_retried_after']} (the last {f['last_failure_after_s']} s after); hit rate before "
          f"{f.get('hit_rate_before')}, recovered after {f.get('hit_rate_recovered_after_s')} s; compiles "
          f"15 s before/after {f['compiles_15s_before']}/{f['compiles_15s_after']}; latency before "
          f"{f['before_10s']} after {f['after_10s']}")
    if "step" in s:
        for row in s["step"]["steps"]:
            p(f"  step {row}")
        p(f"throughput knee at {s['step']['knee_users']} users")
    for x in s["invalid_samples"][:5]:
        p(f"  INVALID {x['name']}: {x['msg']}")
    for x in s["failure_samples"][:5]:
        p(f"  failure {x}")


def plot(summary: dict, events: list[dict], path: Path) -> bool:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    start = next((e["t"] for e in events if e.get("type") == "start"), None)
    reqs = [e for e in events if e.get("type") == "request" and e["kind"] != "retried"]
    if start is None or not reqs:
        return False
    fig, (ax1, ax2, ax3) = plt.subplots(3, 1, figsize=(10, 9), sharex=True)
    good = [r for r in reqs if r["kind"] in ("ok", "truncated")]
    bad = [r for r in reqs if r["kind"] in FAILURE_KINDS]
    ax1.scatter([r["t"] - start for r in good], [r["ms"] for r in good], s=4, alpha=0.35, label="request")
    if bad:
        ax1.scatter([r["t"] - start for r in bad], [r["ms"] for r in bad], s=14, c="red", marker="x", label="failed")
    buckets: dict[int, list[float]] = defaultdict(list)
    for r in good:
        buckets[int((r["t"] - start) // 5)].append(r["ms"])
    xs = sorted(buckets)
    ax1.plot([5 * b + 2.5 for b in xs], [quantile(buckets[b], 0.5) for b in xs], label="p50 (5 s)")
    ax1.plot([5 * b + 2.5 for b in xs], [quantile(buckets[b], 0.99) for b in xs], label="p99 (5 s)")
    ax1.set_ylabel("latency (ms)")
    ax1.set_yscale("log")
    ax1.legend(loc="upper left", fontsize=8)
    hr = summary["cache_hit_rate_over_time"]
    ax2.plot([h["t"] for h in hr], [h["window"] for h in hr], marker="o", label="per 10 s")
    ax2.plot([h["t"] for h in hr], [h["cumulative"] for h in hr], label="cumulative")
    ax2.set_ylabel("grammar cache hit rate")
    ax2.set_ylim(0, 1.05)
    ax2.legend(loc="lower right", fontsize=8)
    for role in ("replica", "shard", "compile_worker", "masks", "proxy"):
        pts = [(r["t"], r[role]) for r in summary["rss_mb"] if role in r]
        if pts:
            ax3.plot([a for a, _ in pts], [b for _, b in pts], label=role)
    ax3.set_ylabel("resident memory (MB)")
    ax3.set_xlabel("time (s)")
    if ax3.lines:
        ax3.legend(loc="upper left", fontsize=8)
    for f in summary["faults"]:
        for ax in (ax1, ax2, ax3):
            ax.axvline(f["at_s"], color="grey", linestyle="--")
        ax1.annotate(f"kill {f['kind']}", (f["at_s"], ax1.get_ylim()[1]), fontsize=8, va="top")
    fig.suptitle(f"{summary['requests']} requests, {summary['invalid_outputs']} invalid, "
                 f"{summary['failed_requests']} failed, p99 {summary['p99_ms']} ms")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


# ------------------------------------------------------------------------------------------------
# The run
# ------------------------------------------------------------------------------------------------

def run_load(*, duration: int = 60, users: int = 8, spawn_rate: float = 2.0, model: str = "tiny",
             url: str | None = None, replicas: int | None = None, shards: int = 2, max_batch: int = 8,
             kill_shard_: bool = False, kill_replica_: bool = False, json_path: str | Path | None = None,
             csv_prefix: str | None = None, shape: str | None = None, out_dir: str | Path | None = None,
             seed: int = 0, sample_every: float = 3.0, request_timeout: float = 60.0,
             max_tokens: tuple[int, int] = (48, 96), stream_fraction: float = 0.25, step_users: int = 2,
             step_s: float = 30.0, port: int | None = None, do_plot: bool = True, progress: bool = True,
             server_options: dict | None = None, mask_service: bool = True,
             startup_timeout_s: float = 120.0, hostile: int = 0, restart_ingress_: bool = False,
             fault_at_s: dict[str, float] | None = None,
             shard_mb: int | None = None) -> dict:
    """See the module note. Returns the summary (also written to `json_path`)."""
    if not 1 <= users <= 256 or not 0 < spawn_rate <= 64 or not 1 <= duration <= 24 * 3600:
        raise ValueError("users 1-256, spawn rate up to 64/s, duration 1 s to 24 h")
    log = say if progress else (lambda _m: None)
    out = Path(out_dir) if out_dir else HERE / "results" / time.strftime("%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    events_path = out / "events.jsonl"
    events_path.unlink(missing_ok=True)
    csv_prefix = csv_prefix or str(out / "locust")
    json_path = Path(json_path) if json_path else out / "summary.json"
    if replicas is None:
        replicas = 2 if kill_replica_ else 1
    with contextlib.ExitStack() as stack:
        server = None
        stats_key = os.environ.get("XG2_STATS_KEY")   # a server of someone else's: its admin key, if given
        if url is None:
            os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
            import logging

            from serve.cli import Server

            logging.getLogger("ray.serve").setLevel(logging.WARNING)      # this script says what happens
            port = port or free_port()
            log(f"starting the application: model {model}, {replicas} replica(s), {shards} shard(s), port {port}")
            from serve.keys import open_with_admin

            ring, stats_key = open_with_admin()     # the users are open tenants; the sampler reads all
            server = Server(model=model, port=port, replicas=replicas, shards=shards, max_batch=max_batch,
                            mask_service=mask_service, progress=False, options=server_options, shard_mb=shard_mb,
                            api_keys=ring)
            server.start()
            stack.callback(server.stop)
            url = server.url
        base = url.removesuffix("/").removesuffix("/v1")
        if not base.startswith(("http://127.0.0.1", "http://localhost", "http://[::1]")):
            raise ValueError(f"{url}: load runs target the loopback only")
        env = {**os.environ, "XG2_LT_EVENTS": str(events_path), "XG2_LT_SEED": str(seed),
               "XG2_LT_TIMEOUT": str(request_timeout), "XG2_LT_MAX_TOKENS": f"{max_tokens[0]},{max_tokens[1]}",
               "XG2_LT_STREAM_FRACTION": str(stream_fraction), "XG2_LT_SHAPE": shape or "",
               "XG2_LT_STEP_USERS": str(step_users), "XG2_LT_STEP_S": str(step_s),
               "XG2_LT_PROMPT_BUDGET": str(PROMPT_BUDGETS.get(model, PROMPT_BUDGETS["default"])),
               "XG2_LT_HOSTILE": str(hostile)}
        stop_timeout = int(min(request_timeout, 30))
        cmd = locust_command(base, users + hostile, spawn_rate, duration, csv_prefix, stop_timeout)
        log(f"locust: {users} users, spawn rate {spawn_rate}/s, {duration} s, shape {shape or 'none'} -> {out}")
        logf = stack.enter_context(open(out / "locust.log", "w"))
        proc = subprocess.Popen(cmd, env=env, cwd=str(ROOT), stdout=logf, stderr=subprocess.STDOUT,
                                start_new_session=True)
        stack.callback(_stop_child, proc)
        t_start = _wait_start(events_path, proc, startup_timeout_s)
        if t_start is None:
            _stop_child(proc)
            raise RuntimeError(f"locust did not start; see {out / 'locust.log'}:\n"
                               + (out / "locust.log").read_text()[-2000:])
        shard_names = [f"{server.shard_prefix}-{i}" for i in range(shards)] if server is not None else None
        sampler = Sampler(base, sample_every, shard_names, t_start, stats_key)
        sampler.start()
        faults: list[dict] = []
        plan = []
        wanted = [w for w, on in (("shard", kill_shard_), ("replica", kill_replica_), ("ingress", restart_ingress_))
                  if on]
        if wanted and server is None:
            raise ValueError("faults need the application started here (no --url)")
        for i, what in enumerate(wanted):       # spread over the run: 1/2, or 1/3 and 2/3, or quarters
            at = (fault_at_s or {}).get(what, (i + 1) * duration / (len(wanted) + 1))     # unless given
            plan.append((t_start + at, what))
        plan.sort()
        deadline = t_start + duration + stop_timeout + 60
        last_note = time.time()
        while proc.poll() is None:
            now = time.time()
            while plan and now >= plan[0][0]:
                _, what = plan.pop(0)
                try:
                    f = (kill_shard(shard_names[0]) if what == "shard" else
                         kill_replica() if what == "replica" else restart_ingress(base))
                    log(f"fault: killed {what} {f.get('target')} at {f['t'] - t_start:.1f} s")
                except Exception as e:      # noqa: BLE001 - a fault that could not be made is reported
                    f = {"kind": what, "t": now, "error": f"{type(e).__name__}: {e}"}
                    log(f"fault: could not kill the {what}: {f['error']}")
                faults.append(f)
            if now > deadline:
                log("locust outlived its time: stopping it")
                _stop_child(proc)
                break
            if now - last_note > 15:
                evs = [e for e in read_events(events_path) if e.get("type") == "request"]
                kinds = Counter(e["kind"] for e in evs)
                log(f"{now - t_start:.0f} s: {len(evs)} attempts {dict(kinds)}")
                last_note = now
            time.sleep(0.5)
        sampler.stop_event.set()
        sampler.join(10)
        with contextlib.suppress(Exception):
            sampler.sample()            # the final figures
        events = read_events(events_path)
        summary = summarize(events, sampler.samples, faults, timeout_s=request_timeout, shape=shape, users=users,
                            step_users=step_users, step_s=step_s, recent=list(sampler.recent.values()))
        summary["config"] = {"duration_s": duration, "users": users, "spawn_rate": spawn_rate, "model": model,
                             "url": url, "replicas": replicas if server else None, "shards": shards if server else None,
                             "shape": shape, "seed": seed, "request_timeout_s": request_timeout,
                             "max_tokens": list(max_tokens), "stream_fraction": stream_fraction,
                             "hostile_users": hostile}
        summary["locust"] = _locust_csv(csv_prefix)
        summary["locust"]["exit_code"] = proc.returncode
        summary["files"] = {"events": str(events_path), "csv_prefix": csv_prefix, "log": str(out / "locust.log"),
                            "json": str(json_path)}
        if do_plot and plot(summary, events, out / "plot.png"):
            summary["files"]["plot"] = str(out / "plot.png")
        (out / "samples.json").write_text(json.dumps(sampler.samples))
        summary["files"]["samples"] = str(out / "samples.json")
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(summary, indent=1))
        return summary


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="loadtests/run.py", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration", type=int, default=60, help="seconds of load (default 60)")
    ap.add_argument("--users", type=int, default=8, help="concurrent users (default 8; the step shape's maximum)")
    ap.add_argument("--spawn-rate", type=float, default=2.0, help="users started per second (default 2)")
    ap.add_argument("--model", default="tiny", help="tiny (default), default, or a model directory")
    ap.add_argument("--url", help="target a running application (http://127.0.0.1:PORT/v1) instead of starting one")
    ap.add_argument("--replicas", type=int, help="model replicas (default 1; 2 with --kill-replica)")
    ap.add_argument("--shards", type=int, default=2, help="cache shards (default 2)")
    ap.add_argument("--max-batch", type=int, default=8)
    ap.add_argument("--kill-shard", action="store_true", help="kill cache shard 0 at 1/3 of the run")
    ap.add_argument("--kill-replica", action="store_true", help="kill a model replica at 2/3 of the run")
    ap.add_argument("--restart-ingress", action="store_true", help="kill Serve's HTTP proxy (it is restarted)")
    ap.add_argument("--hostile", type=int, default=0,
                    help="users of a hostile tenant besides --users (slow schemas, huge tool sets, malformed bodies)")
    ap.add_argument("--cache-mb", type=int, nargs=3, metavar=("GRAMMARS", "COMPILER", "SHARD"),
                    help="the replicas' grammar and compiler caches and each shard's budget (default 64 128 256): "
                         "smaller ones fill sooner, for a soak that reaches its plateau in minutes")
    ap.add_argument("--shape", choices=("step", "soak"), help="load shape (default: -u users from the start)")
    ap.add_argument("--step-users", type=int, default=2, help="step shape: users added per step")
    ap.add_argument("--step-seconds", type=float, default=30.0, help="step shape: seconds per step")
    ap.add_argument("--json", help="summary JSON (default OUT/summary.json)")
    ap.add_argument("--csv", help="locust CSV prefix (default OUT/locust)")
    ap.add_argument("--out", help="output directory (default loadtests/results/<time>)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=60.0, help="bound on each request, seconds (default 60)")
    ap.add_argument("--max-tokens", default="48,96", help="max_tokens drawn from this range (default 48,96)")
    ap.add_argument("--stream-fraction", type=float, default=0.25)
    ap.add_argument("--sample-every", type=float, default=3.0, help="seconds between statistics samples")
    ap.add_argument("--port", type=int, help="the application's port (default: a free one)")
    ap.add_argument("--no-plot", action="store_true")
    args = ap.parse_args(argv)
    lo, _, hi = args.max_tokens.partition(",")
    summary = run_load(duration=args.duration, users=args.users, spawn_rate=args.spawn_rate, model=args.model,
                       url=args.url, replicas=args.replicas, shards=args.shards, max_batch=args.max_batch,
                       kill_shard_=args.kill_shard, kill_replica_=args.kill_replica, json_path=args.json,
                       csv_prefix=args.csv, shape=args.shape, out_dir=args.out, seed=args.seed,
                       sample_every=args.sample_every, request_timeout=args.timeout,
                       max_tokens=(int(lo), int(hi or lo)), stream_fraction=args.stream_fraction,
                       step_users=args.step_users, step_s=args.step_seconds, port=args.port,
                       do_plot=not args.no_plot, hostile=args.hostile, restart_ingress_=args.restart_ingress,
                       server_options={"grammar_cache_mb": args.cache_mb[0], "compiler_cache_mb": args.cache_mb[1]}
                       if args.cache_mb else None, shard_mb=args.cache_mb[2] if args.cache_mb else None)
    print_summary(summary)
    print(f"\nsummary: {summary['files']['json']}" + (f", plot: {summary['files']['plot']}"
                                                      if "plot" in summary["files"] else ""))
    faults = bool(summary["faults"])
    bad = summary["invalid_outputs"] or summary["hung_requests"] or summary["timeouts"] \
        or (summary["failed_requests"] and not faults) or (summary.get("locust") or {}).get("client_exceptions")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
