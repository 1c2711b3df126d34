"""Keys and tenants (issue 34, point 2): a tenant is who its key says, keys are kept as digests, the
server refuses to leave the loopback without keys, the mask service binds calls to keys and caps
tenants and sessions, and a StepClient call never waits without end."""

from __future__ import annotations

import asyncio
import pickle
import time

import pytest

import xg2
from serve.app import stats_view
from serve.keys import Caller, KeyFileError, KeyRing, caller_of, is_loopback, open_tenant
from xg2.actors.host import MatcherHost, StepClient
from xg2.actors.spec import RegexSpec
from xg2.errors import AccessError, QuotaError, SessionError, StepTimeoutError, UsageError

KEY_A = "sk-acme-0123456789abcdef"
KEY_B = "sk-globex-0123456789abcdef"
ADMIN = "sk-ops-0123456789abcdefgh"


def test_a_key_file_names_tenants_and_admins(tmp_path):
    path = tmp_path / "keys"
    path.write_text(f"# tenant key [admin]\nacme {KEY_A}\n\nglobex {KEY_B}  # the second\nops {ADMIN} admin\n")
    ring = KeyRing.from_file(path)
    assert ring.lookup(KEY_A) == Caller("acme") and ring.lookup(KEY_B) == Caller("globex")
    assert ring.lookup(ADMIN) == Caller("ops", admin=True)
    assert ring.lookup(KEY_A[:-1]) is None and ring.lookup(KEY_A + "x") is None and ring.lookup("") is None
    # What is kept is digests: no key in its repr or in what is pickled into every replica.
    blob = pickle.dumps(ring) + repr(ring).encode()
    for k in (KEY_A, KEY_B, ADMIN):
        assert k.encode() not in blob
    assert pickle.loads(pickle.dumps(ring)).lookup(KEY_B) == Caller("globex")


@pytest.mark.parametrize("text,line", [
    ("acme\n", 1),
    (f"acme {KEY_A} root\n", 1),
    (f"acme {KEY_A}\nglobex short\n", 2),
    (f"acme {KEY_A}\nglobex {KEY_A}\n", 2),
    (f"acme {KEY_A}\nbad/name {KEY_B}\n", 2),
])
def test_a_bad_key_file_is_refused_with_its_line(tmp_path, text, line):
    path = tmp_path / "keys"
    path.write_text(text)
    with pytest.raises(KeyFileError) as info:
        KeyRing.from_file(path)
    assert info.value.line == line and f"line {line}" in str(info.value)
    assert KEY_A not in str(info.value)            # a key is never said back


def test_empty_or_missing_key_files_are_refused(tmp_path):
    (tmp_path / "empty").write_text("# nothing\n")
    for path in (tmp_path / "empty", tmp_path / "missing"):
        with pytest.raises(KeyFileError):
            KeyRing.from_file(path)


def test_callers_by_header():
    ring = KeyRing.from_mapping({KEY_A: "acme"})
    assert caller_of(f"Bearer {KEY_A}", ring) == Caller("acme")
    assert caller_of(f"bearer   {KEY_A} ", ring) == Caller("acme")
    for header in ("", "Basic abc", "Bearer ", f"Bearer {KEY_B}"):
        with pytest.raises(LookupError):
            caller_of(header, ring)
    # Open tenants: any token is a tenant of its own, named by a digest of it.
    assert caller_of("Bearer anything", None) == Caller(open_tenant("anything"))
    assert "anything" not in open_tenant("anything")


def test_the_server_refuses_to_leave_the_loopback_without_keys(capsys):
    from serve.cli import Server, main

    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("10.1.2.3") and not is_loopback("example.com")
    with pytest.raises(UsageError, match="--api-keys"):
        Server(host="0.0.0.0", progress=False)
    Server(host="0.0.0.0", progress=False, open_tenants=True)         # said in so many words
    Server(host="0.0.0.0", progress=False, api_keys={KEY_A: "acme"})
    assert main(["--host", "0.0.0.0", "--model", "tiny"]) == 2       # before anything starts
    assert "refusing to serve on 0.0.0.0 without API keys" in capsys.readouterr().err


def test_stats_views():
    figures = {"runtime": {"compiles": 3}, "reuse": {}, "replica": {"id": "r1"},
               "compile_usage": {"acme": 1.5, "globex": 2.0},
               "recent": [{"tenant": "acme", "compile_ms": 1.0}, {"tenant": "globex", "compile_ms": 2.0}]}
    assert stats_view(figures, Caller("ops", admin=True), False, 0, 0) is figures
    mine = stats_view(figures, Caller("acme"), False, 1, 2)
    assert mine == {"replica": {"id": "r1"}, "tenant": "acme", "requests_in_flight": 1, "open_sessions": 2,
                    "compile_usage": {"acme": 1.5}, "recent": [{"tenant": "acme", "compile_ms": 1.0}]}
    open_view = stats_view(figures, Caller("acme"), True, 1, 2)
    assert open_view["runtime"] == {"compiles": 3} and "globex" not in repr(open_view)


@pytest.fixture(scope="module")
def small_host_info():
    vocab = [bytes([b]) for b in range(256)] + [b"</s>"]
    return xg2.TokenizerInfo(vocab, xg2.VocabType.RAW, stop_token_ids=[256])


def test_a_host_with_keys_answers_as_the_keys_tenant(small_host_info):
    host = MatcherHost(small_host_info, keys=KeyRing.from_mapping({KEY_A: "acme", KEY_B: "globex"}))

    async def run():
        spec = {"grammar": {"type": "regex", "pattern": "ab+"}}
        opened = await host.open(KEY_A, spec)
        sid = opened["session"]
        with pytest.raises(AccessError):
            await host.open("acme", spec)               # the tenant's name is not its key
        with pytest.raises(SessionError):
            await host.step(KEY_B, [sid], [None])       # another key's tenant cannot reach it
        out = await host.step(KEY_A, [sid], [ord("a")])
        assert out["accepted"] == [True] and out["failed"] == [False]
        assert host.runtime.open_sessions("acme") == 1
        assert await host.close(KEY_B, [sid]) == 0 and await host.close(KEY_A, [sid]) == 1

    try:
        asyncio.run(run())
    finally:
        host.runtime.shutdown()


def test_a_host_caps_tenants_and_sessions(small_host_info):
    host = MatcherHost(small_host_info, max_tenants=2, max_sessions=3)
    spec = {"grammar": {"type": "regex", "pattern": "ab+"}}

    async def run():
        a1 = (await host.open("a", spec))["session"]
        await host.open("b", spec)
        with pytest.raises(QuotaError, match="max_tenants"):
            await host.open("c", spec)                  # a third tenant
        await host.open("a", spec)
        with pytest.raises(QuotaError, match="max_sessions"):
            await host.open("b", spec)                  # a fourth session
        await host.close("a", [a1])
        await host.open("b", spec)                      # room again
        assert host.runtime.open_sessions() == 3

    try:
        asyncio.run(run())
    finally:
        host.runtime.shutdown()
    with pytest.raises(ValueError):
        xg2.actors.GrammarRuntime(small_host_info, max_tenants=0)


class _Stuck:
    """A host whose calls never answer (as a hung or partitioned replica's)."""

    class _Ref:
        def result(self, timeout_s=None):
            time.sleep(timeout_s)
            raise TimeoutError

        def __await__(self):
            return asyncio.sleep(3600).__await__()

    class _Method:
        def remote(self, *args, **kwargs):
            return _Stuck._Ref()

    def __getattr__(self, name):
        return _Stuck._Method()


def test_every_step_client_call_has_a_timeout():
    client = StepClient(_Stuck(), KEY_A, 300, timeout_s=0.2)
    spec = RegexSpec("ab+")
    for call in (lambda: client.open(spec), lambda: client.step(["s1"], [None]), lambda: client.close(["s1"])):
        t0 = time.perf_counter()
        with pytest.raises(StepTimeoutError) as info:
            call()
        assert time.perf_counter() - t0 < 2.0
        assert isinstance(info.value, xg2.XG2Error) and isinstance(info.value, TimeoutError)

    async def run():
        for call in (client.open_async(spec), client.step_async(["s1"], [None]), client.close_async(["s1"])):
            t0 = time.perf_counter()
            with pytest.raises(StepTimeoutError) as info:
                await call
            assert time.perf_counter() - t0 < 2.0
        return info.value

    last = asyncio.run(run())
    assert last.session_ids == [] and "0.2 s" in str(last)
    with pytest.raises(StepTimeoutError) as info:
        client.step(["s1", "s2"], [None, None])
    assert info.value.session_ids == ["s1", "s2"] and "unknown" in str(info.value)
    with pytest.raises(UsageError):
        StepClient(_Stuck(), KEY_A, 300, timeout_s=0)


def test_keys_and_open_tenants_together():
    """Listed keys are their tenants; any other token is a tenant of its own, whose name no key can
    give (so a tenant's name sent as a token is not that tenant)."""
    from serve.keys import open_with_admin

    ring = KeyRing([(KEY_A, "acme", False), (ADMIN, "ops", True)], open_tenants=True)
    assert ring.caller(KEY_A) == Caller("acme") and ring.caller(ADMIN) == Caller("ops", admin=True)
    other = ring.caller("acme")
    assert other is not None and other.tenant != "acme" and not other.admin
    assert ring.caller("") is None
    assert caller_of("Bearer whatever", ring).tenant == open_tenant("whatever")
    closed = KeyRing([(KEY_A, "acme", False)])
    assert closed.caller("acme") is None and closed.with_open_tenants().caller("acme") == other
    ring2, admin = open_with_admin()
    assert ring2.caller(admin).admin and ring2.caller("someone") == Caller(open_tenant("someone"))
    with pytest.raises(KeyFileError):
        KeyRing([])                     # no keys and not open: refused
