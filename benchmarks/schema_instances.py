"""Seeded, model-like instances of a JSON Schema (tool arguments for the tool-calling benchmark).

`valid_instance(schema, rng)` writes a value the way a model filling a tool call would: every
required property, some optional ones, short realistic strings (now and then with a quote, a
newline or CJK text), numbers within their bounds, enum members, small arrays, nested objects;
`$ref` (local), `anyOf`/`oneOf` (a branch at random), `allOf` (merged), `format` (date-time,
date, time, email, uri, ipv4, ipv6, uuid, hostname) and `pattern` (sampled from the regex's
parse tree) are followed. Each candidate is checked with `jsonschema` (the draft named by
`$schema`, 2020-12 otherwise; format assertions on); a few rich attempts are made, then
simpler ones (required properties only, shortest arrays); `Unsatisfiable` when none validates.
Property order follows the schema (`properties`, then required names not listed there), which
is the order the engines enforce.
"""

from __future__ import annotations

import math
import random
import re
import string
from typing import Any

try:
    import re._parser as _sre  # Python >= 3.11
except ImportError:  # pragma: no cover
    import sre_parse as _sre  # type: ignore[no-redef]

#: Deeper than this, objects get their required members only and arrays their minimum length.
MAX_DEPTH = 5
#: Give up on schemas (recursive, say) that need more nesting than this.
HARD_DEPTH = 12

_PHRASES = ["Paris", "quarterly report", "weather in Berlin", "main", "src/app.py", "hello world",
            "東京タワー", "北京天气", "Café au lait", "project-alpha", "John Smith", "release notes v2",
            "temperature", "open issues", "Bearer token", "sales_2024.csv", "en", "summary", "high"]
_SPICE = ['say "hi" twice', "line one\nline two", "tab\there", "50% off", "C:\\temp\\out.txt"]
_NAMED = {"url": "https://example.com/docs/page", "uri": "https://example.com/docs/page", "link": "https://example.com/a",
          "email": "jane.doe@example.com", "date": "2024-05-17", "time": "14:30:00", "path": "/home/user/notes.txt",
          "file": "report.pdf", "id": "a1b2c3", "query": "latest news on AI", "city": "Lisbon", "name": "Alice",
          "lang": "en", "language": "en", "code": "print(1)", "country": "PT", "symbol": "AAPL", "title": "Weekly sync"}
_FORMATS = {"date-time": ["2024-05-17T14:30:00Z", "2023-11-02T08:05:00+01:00"], "date": ["2024-05-17", "2023-01-31"],
            "time": ["14:30:00Z", "08:05:00+01:00"], "email": ["jane.doe@example.com"],
            "uri": ["https://example.com/docs/page", "https://api.example.org/v1/items?id=7"],
            "url": ["https://example.com/docs/page"], "uri-reference": ["/docs/page", "https://example.com/x"],
            "ipv4": ["192.168.1.7", "10.0.0.42"], "ipv6": ["2001:db8::1", "fe80::1ff:fe23:4567:890a"],
            "uuid": ["3f2b8c1e-9d4a-4b6e-8f0a-2c7d5e9b1a34"], "hostname": ["api.example.com"]}


class Unsatisfiable(Exception):
    """No instance could be made (e.g. a required `{"not": {}}`, or a regex we cannot sample)."""


def valid_instance(schema: Any, rng: random.Random, rich_attempts: int = 4, simple_attempts: int = 3) -> Any:
    """A value valid under `schema` (checked with jsonschema); Unsatisfiable when none was found."""
    validator = _validator(schema)
    last = "no attempt"
    for attempt in range(rich_attempts + simple_attempts):
        gen = _Gen(schema, rng, simple=attempt >= rich_attempts)
        try:
            value = gen.value(schema, 0, "")
        except (Unsatisfiable, RecursionError) as exc:
            last = str(exc) or type(exc).__name__
            continue
        try:
            errors = list(validator.iter_errors(value))
        except Exception as exc:  # noqa: BLE001 - a schema jsonschema cannot evaluate
            last = f"jsonschema: {type(exc).__name__}: {exc}"
            continue
        if not errors:
            return value
        last = f"invalid: {errors[0].message[:120]}"
    raise Unsatisfiable(last)


def _validator(schema: Any) -> Any:
    import jsonschema

    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    return cls(schema, format_checker=cls.FORMAT_CHECKER)


class _Gen:
    def __init__(self, root: Any, rng: random.Random, simple: bool) -> None:
        self.root = root
        self.rng = rng
        self.simple = simple
        self.optional_p = 0.0 if simple else 0.4

    # -------------------------------------------------------------- schema handling

    def resolve(self, s: Any, depth: int) -> Any:
        """`s` with its local `$ref` (and `allOf`) replaced by what they point to."""
        for _ in range(HARD_DEPTH):
            if not isinstance(s, dict):
                return s
            if "$ref" in s:
                target = self.pointer(s["$ref"])
                s = {**target, **{k: v for k, v in s.items() if k != "$ref"}} if isinstance(target, dict) else target
            elif "allOf" in s:
                merged = {k: v for k, v in s.items() if k != "allOf"}
                for part in s["allOf"]:
                    part = self.resolve(part, depth)
                    if part is False:
                        raise Unsatisfiable("allOf member false")
                    if isinstance(part, dict):
                        for k, v in part.items():
                            if k == "properties" and isinstance(merged.get(k), dict):
                                merged[k] = {**merged[k], **v}
                            elif k == "required" and isinstance(merged.get(k), list):
                                merged[k] = list(dict.fromkeys(merged[k] + v))
                            else:
                                merged.setdefault(k, v)
                s = merged
            else:
                return s
        raise Unsatisfiable("$ref chain too long")

    def pointer(self, ref: str) -> Any:
        if not ref.startswith("#"):
            raise Unsatisfiable(f"non-local $ref {ref}")
        node = self.root
        for part in [p for p in ref[1:].split("/") if p]:
            part = part.replace("~1", "/").replace("~0", "~")
            if isinstance(node, list):
                node = node[int(part)]
            elif isinstance(node, dict) and part in node:
                node = node[part]
            else:
                raise Unsatisfiable(f"dangling $ref {ref}")
        return node

    def value(self, s: Any, depth: int, name: str) -> Any:
        if depth > HARD_DEPTH:
            raise Unsatisfiable("nesting too deep")
        s = self.resolve(s, depth)
        if s is True or s == {}:
            return self.text(name, {})
        if s is False or not isinstance(s, dict):
            raise Unsatisfiable("false schema")
        if "const" in s:
            return s["const"]
        if "enum" in s:
            if not s["enum"]:
                raise Unsatisfiable("empty enum")
            return self.rng.choice(s["enum"])
        for key in ("anyOf", "oneOf"):
            if key in s:
                return self.branch(s, key, depth, name)
        if "not" in s and s["not"] in ({}, True):
            raise Unsatisfiable("not {}")
        kind = self.kind(s)
        if kind == "object":
            return self.obj(s, depth)
        if kind == "array":
            return self.array(s, depth, name)
        if kind == "string":
            return self.text(name, s)
        if kind in ("integer", "number"):
            return self.number(s, kind == "integer")
        if kind == "boolean":
            return self.rng.random() < 0.5
        return None

    def branch(self, s: dict, key: str, depth: int, name: str) -> Any:
        rest = {k: v for k, v in s.items() if k != key}
        branches = list(s[key])
        self.rng.shuffle(branches)
        # a model fills the argument rather than writing null, most of the time
        branches.sort(key=lambda b: isinstance(b, dict) and b.get("type") == "null" and self.rng.random() < 0.85)
        for b in branches:
            b = self.resolve(b, depth)
            if b is False or (isinstance(b, dict) and b.get("not") in ({}, True)):
                continue
            try:
                return self.value({**rest, **b} if isinstance(b, dict) else rest, depth, name)
            except Unsatisfiable:
                continue
        raise Unsatisfiable(f"no {key} branch")

    def kind(self, s: dict) -> str:
        t = s.get("type")
        if isinstance(t, list):
            options = [x for x in t if x != "null"] or ["null"]
            if "null" in t and self.rng.random() < 0.1:
                return "null"
            return self.rng.choice(options)
        if isinstance(t, str):
            return t
        if any(k in s for k in ("properties", "required", "additionalProperties", "patternProperties")):
            return "object"
        if any(k in s for k in ("items", "prefixItems", "minItems", "maxItems")):
            return "array"
        if any(k in s for k in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf")):
            return "number"
        return "string"

    # ------------------------------------------------------------------ values

    def obj(self, s: dict, depth: int) -> dict:
        props = s.get("properties", {}) or {}
        required = [r for r in s.get("required", []) if isinstance(r, str)]
        names = list(props) + [r for r in dict.fromkeys(required) if r not in props]
        p = 0.0 if depth >= MAX_DEPTH else self.optional_p
        chosen = [n for n in names if n in required or self.rng.random() < p]
        missing = int(s.get("minProperties", 0)) - len(chosen)
        for n in names:
            if missing <= 0:
                break
            if n not in chosen:
                chosen.append(n)
                missing -= 1
        chosen = [n for n in names if n in chosen]   # schema order
        out = {}
        for n in chosen:
            sub = props[n] if n in props else s.get("additionalProperties", True)
            if sub is False:
                sub = True
            out[n] = self.value(sub, depth + 1, n)
        return out

    def array(self, s: dict, depth: int, name: str) -> list:
        prefix = s.get("prefixItems") or (s["items"] if isinstance(s.get("items"), list) else [])
        items = s.get("items") if isinstance(s.get("items"), (dict, bool)) else s.get("additionalItems", True)
        lo = int(s.get("minItems", 0))
        hi = s.get("maxItems")
        hi = lo + 3 if hi is None else int(hi)
        if self.simple or depth >= MAX_DEPTH:
            n = lo
        else:
            n = min(hi, max(lo, self.rng.choice([1, 1, 2, 2, 3])))
        out: list = []
        seen = set()
        tries = 0
        while len(out) < n:
            tries += 1
            if tries > 4 * n + 8:
                raise Unsatisfiable("array items")
            sub = prefix[len(out)] if len(out) < len(prefix) else items
            if sub is False:
                raise Unsatisfiable("no more items")
            v = self.value(sub if sub is not None else True, depth + 1, name.rstrip("s"))
            if s.get("uniqueItems"):
                key = repr(v)
                if key in seen:
                    continue
                seen.add(key)
            out.append(v)
        return out

    def text(self, name: str, s: dict) -> str:
        fmt = s.get("format")
        if isinstance(fmt, str) and fmt in _FORMATS:
            return self.rng.choice(_FORMATS[fmt])
        if isinstance(s.get("pattern"), str):
            for _ in range(8):
                v = sample_regex(s["pattern"], self.rng)
                if self.fits(v, s):
                    return v
            raise Unsatisfiable(f"pattern {s['pattern']!r}")
        key = name.lower()
        hint = next((v for k, v in _NAMED.items() if key in (k, k + "s") or key.endswith(("_" + k, "-" + k))
                     or name.endswith(k.title())), None)
        if self.simple:
            v = "x"
        elif hint is not None and self.rng.random() < 0.8:
            v = hint
        elif self.rng.random() < 0.12:
            v = self.rng.choice(_SPICE)
        else:
            v = self.rng.choice(_PHRASES)
        lo, hi = int(s.get("minLength", 0)), s.get("maxLength")
        if len(v) < lo:
            v += "x" * (lo - len(v))
        if hi is not None and len(v) > int(hi):
            v = v[: int(hi)]
        return v

    @staticmethod
    def fits(v: str, s: dict) -> bool:
        return int(s.get("minLength", 0)) <= len(v) <= int(s.get("maxLength", 1 << 30))

    def number(self, s: dict, integer: bool) -> int | float:
        lo, hi = s.get("minimum"), s.get("maximum")
        lo_x, hi_x = s.get("exclusiveMinimum"), s.get("exclusiveMaximum")
        eps = 1 if integer else 0.01
        # draft-4 booleans make minimum/maximum exclusive; later drafts give the bound itself
        if lo_x is True and lo is not None:
            lo = lo + eps
        elif isinstance(lo_x, (int, float)) and not isinstance(lo_x, bool):
            lo = max(lo, lo_x + eps) if lo is not None else lo_x + eps
        if hi_x is True and hi is not None:
            hi = hi - eps
        elif isinstance(hi_x, (int, float)) and not isinstance(hi_x, bool):
            hi = min(hi, hi_x - eps) if hi is not None else hi_x - eps
        if lo is None and hi is None:
            lo, hi = 0, self.rng.choice([5, 10, 100, 1000])
        elif lo is None:
            lo = hi - self.rng.choice([5, 100])
        elif hi is None:
            hi = lo + self.rng.choice([5, 100])
        if lo > hi:
            raise Unsatisfiable("empty numeric range")
        step = s.get("multipleOf")
        if isinstance(step, (int, float)) and step > 0:
            k_lo, k_hi = math.ceil(lo / step), math.floor(hi / step)
            if k_lo > k_hi:
                raise Unsatisfiable("no multiple in range")
            v = self.rng.randint(k_lo, min(k_hi, k_lo + 20)) * step
            return int(v) if integer or float(v).is_integer() else round(v, 10)
        if integer or self.simple or self.rng.random() < 0.5:
            a, b = math.ceil(lo), math.floor(hi)
            if a > b:
                raise Unsatisfiable("no integer in range")
            return self.rng.randint(a, min(b, a + 1000))
        return round(self.rng.uniform(lo, hi), 2)


# ---------------------------------------------------------------------- regexes

_WORD = string.ascii_letters + string.digits + "_"


def sample_regex(pattern: str, rng: random.Random) -> str:
    """A string matching `pattern` in full (anchors dropped), from Python's own regex parser."""
    try:
        tree = _sre.parse(pattern)
    except re.error as exc:
        raise Unsatisfiable(f"regex: {exc}") from None
    return "".join(_sample(tree, rng))


def _sample(tree: Any, rng: random.Random) -> list[str]:
    out: list[str] = []
    for op, av in tree:
        if op is _sre.LITERAL:
            out.append(chr(av))
        elif op is _sre.NOT_LITERAL:
            out.append(rng.choice([c for c in "abcxyz" if ord(c) != av]))
        elif op is _sre.ANY:
            out.append(rng.choice(string.ascii_lowercase))
        elif op is _sre.IN:
            out.append(_sample_class(av, rng))
        elif op in (_sre.MAX_REPEAT, _sre.MIN_REPEAT, getattr(_sre, "POSSESSIVE_REPEAT", None)):
            lo, hi, sub = av
            hi = lo + 3 if hi is _sre.MAXREPEAT else min(hi, lo + 3)
            for _ in range(rng.randint(lo, hi)):
                out.extend(_sample(sub, rng))
        elif op is _sre.SUBPATTERN:
            out.extend(_sample(av[-1], rng))
        elif op is _sre.BRANCH:
            out.extend(_sample(rng.choice(av[1]), rng))
        elif op is _sre.AT:
            continue
        else:
            raise Unsatisfiable(f"regex construct {op}")
    return out


def _in_class(ch: str, items: list) -> bool:
    hit = False
    for op, av in items:
        if op is _sre.NEGATE:
            continue
        if op is _sre.LITERAL:
            hit |= ord(ch) == av
        elif op is _sre.RANGE:
            hit |= av[0] <= ord(ch) <= av[1]
        elif op is _sre.CATEGORY:
            name = str(av)
            hit |= (("DIGIT" in name and ch.isdigit()) or ("WORD" in name and (ch.isalnum() or ch == "_"))
                    or ("SPACE" in name and ch.isspace())) != ("NOT" in name)
    negated = bool(items) and items[0][0] is _sre.NEGATE
    return hit != negated


def _sample_class(items: list, rng: random.Random) -> str:
    pool = [c for c in _WORD + " -.:/" if _in_class(c, items)]
    if not pool:
        raise Unsatisfiable("character class")
    return rng.choice(pool)
