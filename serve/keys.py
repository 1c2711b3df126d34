"""API keys: which tenant a request speaks for, and whether it may read every tenant's figures.

Per-tenant limits (sessions, compiles, compile time, in-flight requests) only separate tenants if
a tenant cannot become another one at will. With a key file (`xg2 serve --api-keys FILE`) only
its keys are let in, each naming its tenant; without one ("open tenants") any bearer token is a
tenant of its own, which is fine on the loopback of a developer's machine and nowhere else (a
client that rotates keys escapes every per-tenant limit), so `xg2 serve` refuses to listen off
the loopback without keys unless told `--open-tenants`.

What is kept of a key is its SHA-256 digest: the ring pickled into every replica, its repr and
any log line never hold a key. A presented key's digest is compared with every stored digest in
constant time, so how long a lookup takes says nothing about which key (or which prefix) is close.

The key file: one key per line, `TENANT KEY [admin]`, `#` starts a comment. An admin key reads
every tenant's figures at `/v1/xg2/stats`; a tenant's key reads its own. Keys and open tenants
together (`--api-keys FILE --open-tenants`): the keys listed are their tenants (and admins), any
other token is a tenant of its own.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from xg2.errors import UsageError

_TENANT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
#: Shorter keys are refused: a key is a secret, and a short one is guessed.
MIN_KEY_CHARS = 16


class KeyFileError(UsageError):
    """A key file that cannot be used; `line` is the 1-based line at fault (None: the file)."""

    def __init__(self, message: str, line: int | None = None):
        self.line = line
        super().__init__(message if line is None else f"{message} (line {line})")


@dataclass(frozen=True)
class Caller:
    """Who a request speaks for."""

    tenant: str
    admin: bool = False


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8")).digest()


class KeyRing:
    """Key digests -> (tenant, admin). Built from a key file or a mapping key -> tenant."""

    def __init__(self, entries: Iterable[tuple[str, str, bool]], *, open_tenants: bool = False):
        """`open_tenants`: a token not listed is a tenant of its own (see `caller`), not refused."""
        self.open_tenants = open_tenants
        self._entries: list[tuple[bytes, str, bool]] = []
        seen: set[bytes] = set()
        for key, tenant, admin in entries:
            if not isinstance(key, str) or len(key) < MIN_KEY_CHARS or any(c.isspace() for c in key):
                raise KeyFileError(f"an API key must be at least {MIN_KEY_CHARS} characters without spaces "
                                   f"(tenant {tenant!r})")
            if not isinstance(tenant, str) or not _TENANT.fullmatch(tenant):
                raise KeyFileError(f"tenant name {tenant!r}: 1-64 of letters, digits, '.', '_', '-'")
            d = _digest(key)
            if d in seen:
                raise KeyFileError(f"a key is listed twice (tenant {tenant!r})")
            seen.add(d)
            self._entries.append((d, tenant, bool(admin)))
        if not self._entries and not open_tenants:
            raise KeyFileError("no API keys given")

    @classmethod
    def from_mapping(cls, keys: Mapping[str, str]) -> KeyRing:
        """key -> tenant (no admin keys), as `serve.app.build`'s `api_keys` arg."""
        return cls((k, t, False) for k, t in keys.items())

    @classmethod
    def from_file(cls, path: str | Path) -> KeyRing:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise KeyFileError(f"cannot read the key file {path}: {e}") from None
        entries: list[tuple[str, str, bool]] = []
        seen: set[bytes] = set()
        for n, raw in enumerate(text.splitlines(), 1):
            line = raw.split("#", 1)[0].strip()
            if not line:
                continue
            parts = line.split()
            if len(parts) not in (2, 3) or (len(parts) == 3 and parts[2] != "admin"):
                raise KeyFileError("expected 'TENANT KEY' or 'TENANT KEY admin'", n)
            try:
                KeyRing([(parts[1], parts[0], False)])      # says which line is wrong
            except KeyFileError as e:
                raise KeyFileError(str(e), n) from None
            if _digest(parts[1]) in seen:
                raise KeyFileError(f"a key is listed twice (tenant {parts[0]!r})", n)
            seen.add(_digest(parts[1]))
            entries.append((parts[1], parts[0], len(parts) == 3))
        return cls(entries)

    def lookup(self, key: str) -> Caller | None:
        """The caller a key names, or None. Every stored digest is compared, in constant time."""
        d = _digest(key)
        found: Caller | None = None
        for stored, tenant, admin in self._entries:
            if hmac.compare_digest(stored, d):
                found = Caller(tenant, admin)
        return found

    def caller(self, token: str) -> Caller | None:
        """The caller a bearer token is: its key's, else with open tenants a tenant of its own (a
        name no key file can give: `open_tenant`); None when refused."""
        found = self.lookup(token)
        if found is None and self.open_tenants and token:
            return Caller(open_tenant(token))
        return found

    def with_open_tenants(self) -> KeyRing:
        ring = KeyRing.__new__(KeyRing)
        ring._entries, ring.open_tenants = list(self._entries), True
        return ring

    @property
    def tenants(self) -> set[str]:
        return {t for _, t, _ in self._entries}

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"KeyRing({len(self)} keys, {len(self.tenants)} tenants{', open tenants' if self.open_tenants else ''})"


def open_tenant(key: str) -> str:
    """The tenant a bearer token is with open tenants: a digest, never the key itself (and never a
    name a key file can give: those have no '~')."""
    return "key~" + hashlib.blake2b(key.encode(), digest_size=8).hexdigest()


def caller_of(authorization: str, ring: KeyRing | None) -> Caller:
    """The caller an `Authorization` header names; LookupError (the caller answers 401) when
    there is no bearer token, or the ring does not know it."""
    key = authorization[7:].strip() if authorization[:7].lower() == "bearer " else ""
    if not key:
        raise LookupError("no API key: send it as 'Authorization: Bearer <key>'")
    if ring is None:
        return Caller(open_tenant(key))
    caller = ring.caller(key)
    if caller is None:
        raise LookupError("unknown API key")
    return caller


def is_loopback(host: str) -> bool:
    """Whether listening on `host` keeps the server on this machine."""
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def open_with_admin() -> tuple[KeyRing, str]:
    """Open tenants plus one fresh admin key (the ring, the key): what a load test or benchmark
    starts its server with, to read every tenant's figures while its clients are tenants of their own."""
    import secrets

    admin = "admin-" + secrets.token_urlsafe(24)
    return KeyRing([(admin, "operator", True)], open_tenants=True), admin
