"""JSONSchemaBench sample in CI: xg2 never crashes on real schemas, accepts their valid documents
token by token, and random walks through its masks produce documents the schema validates.

A fixed sample (the first records of every subset, in the data's fixed order) keeps this under a
minute; `benchmarks/bench_jsonschema.py` runs the whole benchmark against the other engines.
"""

from __future__ import annotations

import json
import random
import sys
import warnings
from pathlib import Path

import jsonschema
import numpy as np
import pytest
from conftest import SHARED

import xg2

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from bench_jsonschema import ALL_SUBSETS, schema_order

DATA = SHARED / "data" / "jsonschemabench"
#: Records taken from the start of each subset.
PER_SUBSET = 8
WALKS = 3
WALK_MAX_STEPS = 400


def _records(subset: str) -> list[dict]:
    path = DATA / f"{subset}.jsonl"
    if not path.exists():
        pytest.skip(f"{path} not found: the benchmark data lives in ../shared beside the checkout")
    with path.open(encoding="utf-8") as f:
        return [json.loads(line) for _, line in zip(range(PER_SUBSET), f)]


@pytest.fixture(scope="module")
def compiler(deepseek_info):
    return xg2.GrammarCompiler(deepseek_info, max_threads=1, cache_enabled=False)


@pytest.fixture(scope="module")
def walk_tables(deepseek_info):
    """Token bytes, and which tokens hold a quote/bracket/brace/comma: walks favour those so
    that strings and containers close within the step cap."""
    tb = list(deepseek_info.decoded_vocab)
    structural = np.array([any(c in b for c in b'"]},') for b in tb], dtype=bool)
    return tb, structural


def _accepts(compiled, tokenizer, eos: int, text: str) -> bool:
    m = xg2.GrammarMatcher(compiled)
    for tok in tokenizer.encode(text, add_special_tokens=False).ids:
        if not m.accept_token(tok):
            return False
    return m.accept_token(eos) and m.is_terminated()


def _walk(compiled, info, tables, rng: random.Random) -> bytes | None:
    """One random token walk through the masks; None if it does not end within the cap."""
    tb, structural = tables
    stops = list(info.stop_token_ids)
    m = xg2.GrammarMatcher(compiled)
    bitmask = xg2.allocate_token_bitmask(1, info.vocab_size)
    out = bytearray()
    for _ in range(WALK_MAX_STEPS):
        m.fill_next_token_bitmask(bitmask)
        words = np.asarray(bitmask).reshape(-1)  # a torch tensor when torch is installed
        bits = np.unpackbits(words.view(np.uint8), bitorder="little")[: info.vocab_size].astype(bool)
        stop_ok = [s for s in stops if bits[s]]
        bits[stops] = False
        if stop_ok and (rng.random() < 0.3 or not bits.any()):
            assert m.accept_token(stop_ok[0]) and m.is_terminated()
            return bytes(out)
        assert bits.any(), f"dead end after {bytes(out)[-200:]!r}"
        if rng.random() < 0.5 and (bits & structural).any():
            bits &= structural
        cand = np.flatnonzero(bits)
        tok = int(cand[rng.randrange(cand.size)])
        assert m.accept_token(tok), f"token {tok} {tb[tok]!r} in the mask but rejected after {bytes(out)[-200:]!r}"
        out += tb[tok]
    return None


@pytest.mark.parametrize("subset", ALL_SUBSETS)
def test_jsonschemabench_sample(subset, compiler, deepseek_info, deepseek_tokenizer, walk_tables):
    eos = deepseek_info.stop_token_ids[0]
    stats = {"schemas": 0, "compiled": 0, "unsupported": 0, "valid_ok": 0, "invalid": 0, "invalid_rejected": 0,
             "walks": 0}
    problems = []
    for rec in _records(subset):
        stats["schemas"] += 1
        schema = rec["schema"]
        try:
            compiled = compiler.compile_json_schema(schema, any_whitespace=True, strict_mode=False)
        except xg2.XG2Error:
            stats["unsupported"] += 1
            continue
        except Exception as exc:  # noqa: BLE001 - any other exception is the crash this test looks for
            problems.append((rec["id"], f"crash: {type(exc).__name__}: {exc}"))
            continue
        stats["compiled"] += 1
        for i, t in enumerate(rec["tests"]):
            text = json.dumps(t["data"], ensure_ascii=False)
            ok = _accepts(compiled, deepseek_tokenizer, eos, text)
            if t["valid"]:
                if not ok:
                    # Members in another order than the schema's are rejected by design (as by
                    # xgrammar and llguidance); the document must pass once reordered.
                    text2 = json.dumps(schema_order(t["data"], [schema], schema), ensure_ascii=False)
                    ok = text2 != text and _accepts(compiled, deepseek_tokenizer, eos, text2)
                stats["valid_ok"] += ok
                if not ok:
                    problems.append((rec["id"], f"valid test {i} rejected: {text[:200]}"))
            else:
                # Invalid documents are counted, not asserted: some keywords are documented
                # approximations (e.g. oneOf as anyOf).
                stats["invalid"] += 1
                stats["invalid_rejected"] += not ok
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
        validator = cls(schema)
        rng = random.Random(f"{rec['id']}")
        for _ in range(WALKS):
            raw = _walk(compiled, deepseek_info, walk_tables, rng)
            if raw is None:
                continue
            stats["walks"] += 1
            text = raw.decode("utf-8")
            try:
                doc = json.loads(text)
            except ValueError as exc:
                problems.append((rec["id"], f"walk is not JSON ({exc}): {text[:300]!r}"))
                continue
            try:
                err = jsonschema.exceptions.best_match(validator.iter_errors(doc))
            except Exception:  # noqa: BLE001 - the validator cannot evaluate this schema (remote $ref...)
                break
            if err is not None:
                problems.append((rec["id"], f"walk fails {err.validator}: {err.message[:200]} in {text[:300]!r}"))
    print(subset, stats)
    assert not problems, problems[:5]
