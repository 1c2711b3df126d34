"""`xg2 serve` on a Ray cluster it joins, and the build's namespace.

The cluster is real (ray.cluster_utils.Cluster: a head and a worker node, each its own raylet), not
the test session's Ray; `xg2 serve --address` joins it as a user's command would, and is stopped by a
signal. Whatever it deployed (the shard keeper and its shards, the replicas, Serve itself when nothing
else runs on it) must be gone from the cluster afterwards.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from xg2 import transport
from xg2.actors.keeper import shard_names, shard_prefix
from xg2.actors.tier import namespace_digest

ROOT = Path(__file__).resolve().parents[1]


def test_two_builds_never_share_shards_or_keys(monkeypatch, tmp_path):
    import xg2._ext

    transport.build_id.cache_clear()
    this = transport.build_id()
    try:
        # another version of the package
        monkeypatch.setattr(transport, "engine_version", lambda: "0.1.0+other")
        transport.build_id.cache_clear()
        other_version = transport.build_id()
        monkeypatch.undo()
        # the same version with a core built from other sources
        ext = tmp_path / "_ext"
        shutil.copytree(Path(xg2._ext.__file__).parent, ext,
                        ignore=lambda _d, names: [n for n in names if not n.endswith((".pyx", ".pxi", ".py"))])
        changed = min(ext.glob("*.pxi"))
        changed.write_text(changed.read_text() + "\n# another build\n")
        monkeypatch.setattr(xg2._ext, "__file__", str(ext / "__init__.py"))
        transport.build_id.cache_clear()
        other_core = transport.build_id()
    finally:
        monkeypatch.undo()
        transport.build_id.cache_clear()
    assert transport.build_id() == this         # read again from the installed sources: the same
    assert len({this, other_version, other_core}) == 3
    assert this in shard_prefix() and shard_names(2)[1] == f"{shard_prefix()}-1"
    fp = "ab" * 16
    keys = {namespace_digest(b, fp) for b in (this, other_version, other_core)}
    assert len(keys) == 3 and namespace_digest(this, "cd" * 16) != namespace_digest(this, fp)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cluster_state(address: str) -> dict:
    """The named actors and Serve applications of the cluster, read by a driver of its own."""
    code = (
        "import json, ray\n"
        f"ray.init(address={address!r}, logging_level='ERROR', log_to_driver=False)\n"
        "names = [a['name'] for a in ray.util.list_named_actors(all_namespaces=True)]\n"
        "print('STATE' + json.dumps({'named': names}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"},
                         check=False)
    line = [x for x in out.stdout.splitlines() if x.startswith("STATE")]
    assert line, out.stderr[-2000:]
    return json.loads(line[0][5:])


@pytest.fixture(scope="module")
def cluster():
    from ray.cluster_utils import Cluster

    from serve.local_ray import agent_ports, raylets_told_agent_ports

    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    # On the loopback (the setting above is read when ray is first imported, perhaps already).
    # Each raylet is told its agents' ports, as LocalRay's is: else it waits 15 s at most for its
    # dashboard agent to come up, and exits past that (the node never registers) on a busy machine.
    with raylets_told_agent_ports():
        c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False,
                                                          "node_ip_address": "127.0.0.1", **agent_ports()})
        c.add_node(num_cpus=1, node_ip_address="127.0.0.1", **agent_ports())
    c.wait_for_nodes()
    yield c
    c.shutdown()


# SIGTERM (SIGINT takes the same handler: tests/test_serve_start.py sends it). Without the mask
# service, whose application is deleted by the same loop as the others, to keep the suite in its
# 15 minutes; tests/test_serve_start.py runs every default and looks for OS processes left.
def test_xg2_serve_leaves_nothing_in_the_cluster_it_joined(cluster):
    sig, flags = signal.SIGTERM, ["--no-mask-service"]
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    proc = subprocess.Popen([sys.executable, "-m", "xg2.cli", "serve", "--address", cluster.address,
                             "--model", "tiny", "--port", str(port), *flags], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True).start()
    try:
        deadline = time.monotonic() + 300
        while not any(line.startswith("xg2 serving") for line in lines):     # every application started
            assert proc.poll() is None, "".join(lines)[-3000:]
            assert time.monotonic() < deadline, "xg2 serve did not start"
            time.sleep(0.5)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=10) as r:
            assert r.status == 200
        running = _cluster_state(cluster.address)["named"]
        shards = [n for n in running if n.startswith(shard_prefix())]
        assert len(shards) == 2, running                # the keeper's, named by this build
        proc.send_signal(sig)
        assert proc.wait(120) == 0, "".join(lines)[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    deadline = time.monotonic() + 30
    while True:         # actors die asynchronously after their owner
        left = [n for n in _cluster_state(cluster.address)["named"] if "xg2" in n or n.startswith("SERVE")]
        if not left or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert left == []
