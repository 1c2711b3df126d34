"""Differential soundness of the JSON Schema front-end against the `jsonschema` package.

Generated schemas combine keywords whose meaning depends on their siblings (items/prefixItems,
properties/patternProperties/additionalProperties, propertyNames, unevaluatedProperties) through
allOf, $ref, anyOf, oneOf and not. Documents come from xg2's own masks (a random walk over a small
vocabulary of single bytes and a few multi-byte tokens, until the stop token) and from mutations of
those (a number changed, a member dropped, added or renamed, an item added...). Each is judged by
Draft 2020-12 `jsonschema` and by a fresh matcher fed its bytes. The default mode promises never to
accept an invalid document, so that count must be 0; valid documents rejected (key order, strict
mode, exactness notes) are only reported.
"""

from __future__ import annotations

import json
import math
import os
import random
import time
import warnings
from decimal import Decimal

import jsonschema
import numpy as np
import pytest

import xg2
from xg2.errors import GrammarError, SchemaError, XG2Error

MULTI = ['{"', '":', '", "', '"}', "}, ", "]", "true", "false", "null", ", ", ": ", "12", "-1", "0.5", "ab", 'a"',
         '"a', "\\u00", "é", "😀", "[]", "{}", "[1", "e+", "  "]
VOCAB = [bytes([b]) for b in range(256)] + [t.encode() for t in MULTI] + [b"</s>"]
STOP = len(VOCAB) - 1
#: Random walk weights: closing tokens and the stop token are favoured so documents stay short.
WEIGHTS = np.array([40.0 if i == STOP else 8.0 if tok[-1:] in (b'"', b"}", b"]") else
                    1.0 if all(0x20 <= b < 0x7F for b in tok) else 0.3 if tok[0] >= 0x80 else 0.02
                    for i, tok in enumerate(VOCAB)])

#: The cases of issue 15 (each was accepted wrongly or refused), with documents that must be judged.
ISSUE_CASES = [
    ({"allOf": [{"prefixItems": [{"minimum": 3}]}], "items": {"minimum": 5}}, [[3, 5], [3], [5, 5], [3, 4]]),
    ({"allOf": [{"patternProperties": {"^a": {}}}], "additionalProperties": False}, [{"ab": 1}, {}, {"b": 1}]),
    ({"propertyNames": False, "properties": {"ab": {}}}, [{"ab": 1}, {}]),
    ({"type": "object", "oneOf": [{"required": ["foo", "bar"]}, {"required": ["foo", "baz"]}]},
     [{"foo": 1, "bar": 2}, {"foo": 1, "baz": 2}, {"foo": 1, "bar": 2, "baz": 3}, {"foo": 1}]),
    ({"type": "string", "contentMediaType": "application/json", "contentEncoding": "base64",
      "contentSchema": {"type": "object"}}, ["eyJ9", "x"]),
    ({"type": "object"}, [{}, {"a": 1}, {"a": {"b": [1]}}]),
    # the same class through $ref targets and one-branch anyOfs
    ({"$defs": {"p": {"prefixItems": [{"minimum": 3}]}}, "$ref": "#/$defs/p", "items": {"minimum": 5}},
     [[3, 5], [3, 4]]),
    ({"anyOf": [{"patternProperties": {"^a": {"type": "integer"}}}], "additionalProperties": False,
      "properties": {"b": {}}}, [{"ab": 1}, {"b": 1}, {}]),
    ({"allOf": [{"items": {"minimum": 5}}], "prefixItems": [{"minimum": 3}]}, [[3, 5], [3, 4], [5, 4]]),
    ({"allOf": [{"properties": {"a": {}}, "additionalProperties": False}], "patternProperties": {"^b": {}}},
     [{"a": 1}, {"b": 1}, {"ab": 1}]),
    ({"allOf": [{"patternProperties": {"^a": {"maximum": 1}}, "additionalProperties": {"type": "string"}}],
      "properties": {"ab": {}, "c": {}}}, [{"ab": 1}, {"ab": 2}, {"c": "s"}, {"c": 1}]),
    ({"allOf": [{"propertyNames": {"maxLength": 1}}], "propertyNames": {"pattern": "^[ab]"}, "properties": {
        "ab": {}, "a": {}, "c": {}}}, [{"a": 1}, {"ab": 1}, {"c": 1}, {"b": 1}]),
]

#: Schemas that may be refused (an overlap xg2 cannot enforce) but never under-enforced.
REFUSABLE_CASES = [
    # strict_mode closes the second branch, but the oneOf is judged on the open schema: {"a": 1} is valid
    # under both branches there, so the branches are not disjoint
    ({"type": "object", "oneOf": [{"properties": {"a": {}}, "required": ["a"]}, {"properties": {"b": {}}}]},
     [{"a": 1}, {"b": 1}, {}]),
    ({"allOf": [{"patternProperties": {"^a": {"type": "integer"}}, "additionalProperties": False}],
      "patternProperties": {"b$": {"maximum": 3}}, "additionalProperties": {"type": "string"}},
     [{"ab": 1}, {"a": 1}, {"b": 1}, {"ab": "s"}]),
]

KEYS = ["a", "b", "ab", "ba", "x1"]
PATTERNS = ["^a", "b$", "^x", "1"]


def _scalar(rng: random.Random):
    return rng.choice([None, True, False, 0, 1, -2, 3, 7, 0.5, "a", "ab", "", "x1"])


def _value(rng: random.Random, depth: int = 0):
    r = rng.random()
    if depth < 2 and r < 0.15:
        return [_value(rng, depth + 1) for _ in range(rng.randint(0, 2))]
    if depth < 2 and r < 0.3:
        return {rng.choice(KEYS): _value(rng, depth + 1) for _ in range(rng.randint(0, 2))}
    return _scalar(rng)


class SchemaGen:
    """Random schemas, biased towards sibling-dependent keywords meeting across allOf/$ref/anyOf."""

    def __init__(self, rng: random.Random):
        self.rng = rng
        self.defs = 0

    def schema(self, depth: int = 0):
        rng = self.rng
        if depth >= 3:
            return rng.choice([{"type": "integer"}, {"type": "string"}, {"minimum": 2}, {}, True, {"type": "null"},
                               {"enum": [1, "a", None]}, {"type": "boolean"}, False, {"const": {"a": 1}},
                               {"type": "array", "maxItems": 1}, {"type": "object", "maxProperties": 1}])
        kind = rng.choice(["object", "object", "array", "array", "number", "string", "allOf", "allOf", "anyOf",
                           "oneOf", "not_", "enum", "enum", "ref", "ref"])
        return getattr(self, kind)(depth)

    def object(self, depth: int) -> dict:
        rng = self.rng
        s: dict = {"type": "object"} if rng.random() < 0.7 else {}
        if rng.random() < 0.7:
            s["properties"] = {k: self.schema(depth + 1) for k in rng.sample(KEYS, rng.randint(1, 3))}
            if rng.random() < 0.5:
                s["required"] = rng.sample(list(s["properties"]), 1)
        if rng.random() < 0.35:
            s["patternProperties"] = {p: self.schema(depth + 1) for p in rng.sample(PATTERNS, rng.randint(1, 2))}
        r = rng.random()
        if r < 0.3:
            s["additionalProperties"] = False
        elif r < 0.45:
            s["additionalProperties"] = self.schema(depth + 1)
        elif r < 0.55:
            s["additionalProperties"] = True
        if rng.random() < 0.15:
            s["propertyNames"] = rng.choice([{"pattern": "^[ab]"}, {"maxLength": 1}, False, {"enum": ["a", "ab"]}])
        if rng.random() < 0.15:
            s["minProperties" if rng.random() < 0.5 else "maxProperties"] = rng.randint(0, 2)
        if rng.random() < 0.1 and "properties" in s:
            names = list(s["properties"])
            s["dependentRequired"] = {names[0]: names[-1:]}
        if rng.random() < 0.1:
            s["unevaluatedProperties"] = rng.choice([False, {"type": "integer"}])
        return s

    def array(self, depth: int) -> dict:
        rng = self.rng
        s: dict = {"type": "array"} if rng.random() < 0.7 else {}
        if rng.random() < 0.5:
            s["prefixItems"] = [self.schema(depth + 1) for _ in range(rng.randint(1, 2))]
        r = rng.random()
        if r < 0.5:
            s["items"] = self.schema(depth + 1)
        elif r < 0.65:
            s["items"] = False
        if rng.random() < 0.3:
            s["minItems"] = rng.randint(0, 2)
        if rng.random() < 0.3:
            s["maxItems"] = rng.randint(1, 3)
        return s

    def number(self, depth: int) -> dict:
        rng = self.rng
        s: dict = {"type": rng.choice(["integer", "number"])} if rng.random() < 0.7 else {}
        for kw in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
            if rng.random() < 0.25:
                s[kw] = rng.choice([-1, 0, 2, 3, 5, 2.5])
        if rng.random() < 0.15:
            s["multipleOf"] = rng.choice([2, 3, 0.5, 0.1, 0.01])
        return s

    def string(self, depth: int) -> dict:
        rng = self.rng
        s: dict = {"type": "string"} if rng.random() < 0.7 else {}
        if rng.random() < 0.3:
            s["minLength"] = rng.randint(0, 2)
        if rng.random() < 0.3:
            s["maxLength"] = rng.randint(1, 3)
        if rng.random() < 0.3:
            s["pattern"] = rng.choice(["^a", "b", "^[ab]*$", "^x"])
        elif rng.random() < 0.15:   # formats whose checkers need no optional package
            s["format"] = rng.choice(["date", "ipv4", "ipv6", "uuid", "email"])
        return s

    def siblings(self, depth: int) -> dict:
        """Keywords next to a combinator: the ones its members' keywords depend on."""
        rng = self.rng
        pick = rng.random()
        if pick < 0.3:
            return self.object(depth)
        if pick < 0.55:
            return self.array(depth)
        if pick < 0.7:
            return {"additionalProperties": rng.choice([False, {"type": "integer"}])}
        if pick < 0.8:
            return {"items": self.schema(depth + 1)}
        return {}

    def allOf(self, depth: int) -> dict:
        s = self.siblings(depth)
        s["allOf"] = [self.schema(depth + 1) for _ in range(self.rng.randint(1, 2))]
        return s

    def anyOf(self, depth: int) -> dict:
        s = self.siblings(depth)
        s["anyOf"] = [self.schema(depth + 1) for _ in range(self.rng.choice([1, 1, 2, 3]))]
        return s

    def oneOf(self, depth: int) -> dict:
        s = self.siblings(depth)
        s["oneOf"] = [self.schema(depth + 1) for _ in range(self.rng.randint(1, 3))]
        return s

    def not_(self, depth: int) -> dict:
        rng = self.rng
        s = self.siblings(depth)
        s["not"] = rng.choice([{"type": rng.choice(["string", "null", "array", "integer"])},
                               {"required": [rng.choice(KEYS)]}, {"anyOf": [{"type": "null"}, {"required": ["a"]}]},
                               {}, self.schema(depth + 1)])
        return s

    def enum(self, depth: int) -> dict:
        """Listed values, filtered by xg2's own validator against every sibling (some have no
        grammar form, so this is where the validator is judged)."""
        rng = self.rng
        s = {"enum": [_value(rng) for _ in range(rng.randint(1, 5))]} if rng.random() < 0.8 else {"const": _value(rng)}
        if rng.random() < 0.6:
            s.update(self.siblings(depth))
        if rng.random() < 0.4:
            kw = rng.choice(["if", "contains", "uniqueItems", "dependentSchemas", "not", "unevaluatedProperties"])
            s[kw] = {"if": self.schema(depth + 1), "contains": self.schema(depth + 1), "uniqueItems": True,
                     "dependentSchemas": {rng.choice(KEYS): self.schema(depth + 1)}, "not": self.schema(depth + 1),
                     "unevaluatedProperties": rng.choice([False, {"type": "integer"}])}[kw]
            if kw == "if":
                s["then" if rng.random() < 0.5 else "else"] = self.schema(depth + 1)
            if kw == "contains" and rng.random() < 0.5:
                s["minContains" if rng.random() < 0.5 else "maxContains"] = rng.randint(0, 2)
        return s

    def ref(self, depth: int) -> dict:
        """A reference to a new definition, or to one already made (which may recurse)."""
        s = self.siblings(depth) if self.rng.random() < 0.7 else {}
        if self.pending and self.rng.random() < 0.3:
            s["$ref"] = f"#/$defs/{self.rng.choice(list(self.pending))}"
            return s
        name = f"d{self.defs}"
        self.defs += 1
        self.pending[name] = {}
        self.pending[name] = self.schema(depth + 1)
        s["$ref"] = f"#/$defs/{name}"
        return s

    def top(self):
        self.pending: dict = {}
        root = self.schema()
        if self.pending:
            root = {"allOf": [root]} if not isinstance(root, dict) else root
            root["$defs"] = self.pending
        return root


def _mutate(doc, rng: random.Random):
    """`doc` with one random change somewhere inside it."""
    doc = json.loads(json.dumps(doc))
    spots = [(None, None, doc)]
    i = 0
    while i < len(spots):
        _p, _k, v = spots[i]
        i += 1
        if isinstance(v, dict):
            spots += [(v, k, x) for k, x in v.items()]
        elif isinstance(v, list):
            spots += [(v, j, x) for j, x in enumerate(v)]
    parent, key, v = rng.choice(spots)
    if isinstance(v, bool) or v is None:
        new = rng.choice([0, "a", not v if isinstance(v, bool) else True, None if v is not None else False])
    elif isinstance(v, (int, float)):
        new = rng.choice([v + 1, v - 1, -v, v * 10 if abs(v) < 1e9 else 1, v + 0.5, 0, "1"])
    elif isinstance(v, str):
        new = rng.choice([v + "a", "", "ab", v[:-1], "x1", 1])
    elif isinstance(v, dict):
        new = dict(v)
        op = rng.random()
        if v and op < 0.35:
            del new[rng.choice(list(v))]
        elif v and op < 0.6:
            old = rng.choice(list(v))
            new = {(rng.choice(KEYS + ["zz"]) if k == old else k): x for k, x in v.items()}
        else:
            new[rng.choice(KEYS + ["zz", "a1"])] = rng.choice([_value(rng), *v.values()]) if v else _value(rng)
    else:
        new = list(v)
        if v and rng.random() < 0.3:
            del new[rng.randrange(len(v))]
        else:
            new.insert(rng.randint(0, len(v)), rng.choice([_value(rng), *v]) if v else _value(rng))
    if parent is None:
        return new
    parent[key] = new
    return doc


def _sample(compiled, rng: random.Random, limit: int = 150) -> bytes | None:
    """A document drawn from the masks: random allowed tokens until the stop token."""
    m = xg2.GrammarMatcher(compiled)
    mask = xg2.allocate_token_bitmask(1, len(VOCAB), backend="numpy")
    out = bytearray()
    for _ in range(limit):
        m.fill_next_token_bitmask(mask)
        bits = np.unpackbits(mask[0].view(np.uint8), bitorder="little")[:len(VOCAB)].astype(bool)
        allowed = np.flatnonzero(bits)
        if not len(allowed):
            return None
        w = WEIGHTS[allowed]
        token = int(allowed[rng.choices(range(len(allowed)), weights=w)[0]])
        assert m.accept_token(token)
        if token == STOP:
            return bytes(out)
        out += VOCAB[token]
    return None


def _accepts(compiled, text: bytes) -> bool:
    m = xg2.GrammarMatcher(compiled)
    return m.accept_string(text) and m.accept_token(STOP)


class Written(dict):
    """An object as read with its repeated keys kept apart: `written` members (see _parse)."""

    written = 0


def _min_written(validator, n, instance, schema):
    if validator.is_type(instance, "object") and getattr(instance, "written", len(instance)) < n:
        yield jsonschema.ValidationError(f"{instance!r} has fewer than {n} members")


def _exact_multiple(validator, step, instance, schema):
    if validator.is_type(instance, "number") and math.isfinite(instance):
        quotient = Decimal(repr(instance)) / Decimal(repr(step))
        if quotient != quotient.to_integral_value():
            yield jsonschema.ValidationError(f"{instance!r} is not a multiple of {step!r}")


#: Draft 2020-12, except that minProperties counts the members written (a key written twice counts
#: twice: a grammar cannot tell additional members apart, nor can xgrammar's) and multipleOf is exact
#: decimal arithmetic, as the specification says (jsonschema divides binary floats); the module notes
#: say both.
Oracle = jsonschema.validators.extend(jsonschema.Draft202012Validator, {"minProperties": _min_written,
                                                                        "multipleOf": _exact_multiple})


def _parse(text: bytes) -> list:
    """The JSON values of `text`: one, or with a repeated key two, keeping the first and the last
    value of each; a document is valid only if both are."""
    repeated = []

    def last(items):
        if len({k for k, _v in items}) < len(items):
            repeated.append(True)
        out = Written(items)
        out.written = len(items)
        return out

    def first(items):
        out = Written(reversed(items))
        out.written = len(items)
        return out

    source = text.decode("utf-8")
    doc = json.loads(source, object_pairs_hook=last)
    return [doc, json.loads(source, object_pairs_hook=first)] if repeated else [doc]


@pytest.fixture(scope="module")
def compiler():
    info = xg2.TokenizerInfo(VOCAB, xg2.VocabType.RAW, stop_token_ids=[STOP])
    return xg2.GrammarCompiler(info)


class Tally:
    def __init__(self):
        self.compiled = self.unsupported = self.valid = self.invalid = self.valid_rejected = self.unjudged = 0
        self.invalid_accepted: list = []

    def judge(self, schema, compiled, oracle, doc, text: bytes | None = None, strict: bool = True) -> None:
        if text is None:
            try:
                text = json.dumps(doc, ensure_ascii=False, allow_nan=False).encode()
            except ValueError:      # a sampled 1e999 read as infinity has no JSON spelling
                self.unjudged += 1
                return
        try:
            ok = all(oracle.is_valid(x) for x in _parse(text))
        except RecursionError:  # a reference cycle that consumes nothing: jsonschema cannot judge it
            self.unjudged += 1
            return
        got = _accepts(compiled, text)
        if ok:
            self.valid += 1
            self.valid_rejected += not got
        else:
            self.invalid += 1
            if got:
                self.invalid_accepted.append((schema, strict, text))


def _run(compiler, schema, tally: Tally, rng: random.Random, docs=(), strict: bool = True, lenient: bool = False,
         samples: int = 4, mutations: int = 8) -> bool:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            compiled = compiler.compile_json_schema(schema, strict_mode=strict, lenient=lenient)
    except (SchemaError, GrammarError):    # refused (unsupported, a limit, or no value at all)
        tally.unsupported += 1
        return False
    tally.compiled += 1
    oracle = Oracle(schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
    pool = list(docs)
    for doc in docs:
        tally.judge(schema, compiled, oracle, doc, strict=strict)
    for _ in range(samples):
        text = _sample(compiled, rng)
        if text is None:
            continue
        tally.judge(schema, compiled, oracle, None, text, strict)
        pool.append(_parse(text)[0])
    if pool:
        for _ in range(mutations):
            doc = _mutate(rng.choice(pool), rng)
            tally.judge(schema, compiled, oracle, doc, strict=strict)
    return True


def test_issue_cases(compiler):
    """The reported cases: exact on their documents, and compiled (lenient included) where they are valid."""
    tally = Tally()
    rng = random.Random(15)
    for schema, docs in ISSUE_CASES:
        for strict in (True, False):
            assert _run(compiler, schema, tally, rng, docs, strict=strict), schema
    for schema, docs in REFUSABLE_CASES:
        for strict in (True, False):
            _run(compiler, schema, tally, rng, docs, strict=strict)
    assert not tally.invalid_accepted, tally.invalid_accepted[:5]
    oneof = ISSUE_CASES[3][0]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing relaxed: the presence branches are enforced exactly
        compiled = compiler.compile_json_schema(oneof, lenient=True)
    assert _accepts(compiled, b'{"foo": 1, "bar": 2}') and _accepts(compiled, b'{"foo": 1, "baz": 2}')
    assert not _accepts(compiled, b'{"foo": 1, "bar": 2, "baz": 3}') and not _accepts(compiled, b'{"foo": 1}')


def test_generated_schemas_accept_no_invalid_document(compiler):
    rng = random.Random(int(os.environ.get("XG2_DIFF_SEED", "20261124")))
    gen = SchemaGen(rng)
    tally = Tally()
    t0 = time.perf_counter()
    schemas = 0
    while schemas < int(os.environ.get("XG2_DIFF_SCHEMAS", "4000")) and time.perf_counter() - t0 < 40:
        schema = gen.top()
        schemas += 1
        _run(compiler, schema, tally, rng, strict=schemas % 2 == 0)
    print(f"\nschemas {schemas}: {tally.compiled} compiled, {tally.unsupported} refused; documents: {tally.invalid} "
          f"invalid ({len(tally.invalid_accepted)} accepted), {tally.valid} valid ({tally.valid_rejected} rejected)")
    assert not tally.invalid_accepted, "\n".join(f"{json.dumps(s)} strict={st}: {t!r}"
                                                for s, st, t in tally.invalid_accepted[:5])
    # the run must have had something to judge
    assert tally.compiled >= schemas // 3 and tally.invalid >= 300 and tally.valid >= 300


def test_listed_values_validator_agrees_with_jsonschema():
    """The validator that keeps a schema's listed values (enum/const) valid under all of it, on the
    generated schemas and random values: where it answers (it refuses what it does not support), it
    answers as jsonschema does."""
    from xg2.grammar.json_schema import _Converter
    from xg2.grammar.validator import Validator

    rng = random.Random(7)
    gen = SchemaGen(rng)
    judged = disagreements = 0
    for _ in range(1500):
        schema = gen.top()
        ours = Validator(schema, _Converter(schema, True, None, None, True, None).resolve)
        theirs = Oracle(schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
        for _ in range(6):
            value = _value(rng)
            try:
                got = ours.valid(value, schema, "")
                expected = theirs.is_valid(value)
            except (XG2Error, RecursionError):  # refused, or a reference cycle jsonschema cannot judge
                continue
            judged += 1
            disagreements += got != expected
    assert judged > 4000 and disagreements == 0, disagreements
