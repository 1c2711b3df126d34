"""Check the grammar corpus: every grammar compiles with xgrammar and every sample
is accepted by an xgrammar GrammarMatcher (and by llguidance via the Lark twin).

Usage: python benchmarks/verify_corpus.py [--no-llguidance]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from corpus import load_corpus


def _first_rejected_char(xgr, compiled, sample: str) -> int:
    matcher = xgr.GrammarMatcher(compiled)
    for pos, ch in enumerate(sample):
        if not matcher.accept_string(ch):
            return pos
    return len(sample)


def check_xgrammar(cases) -> int:
    import xgrammar as xgr

    # A tiny byte vocabulary: matcher acceptance of strings does not depend on it.
    vocab = [bytes([i]) for i in range(256)] + [b"</s>"]
    info = xgr.TokenizerInfo(vocab, xgr.VocabType.RAW, stop_token_ids=[256])
    compiler = xgr.GrammarCompiler(info, max_threads=1)
    failures = 0
    for case in cases:
        try:
            grammar = xgr.Grammar.from_ebnf(case.ebnf)
            compiled = compiler.compile_grammar(grammar)
        except Exception as exc:  # noqa: BLE001
            print(f"FAIL xgrammar {case.name}: grammar rejected: {exc}")
            failures += 1
            continue
        for i, sample in enumerate(case.samples):
            size = len(sample.encode("utf-8"))
            if not 100 <= size <= 1500:
                print(f"FAIL {case.name}#{i}: sample is {size} bytes (want 100..1500)")
                failures += 1
            matcher = xgr.GrammarMatcher(compiled)
            ok = matcher.accept_string(sample)
            done = ok and (matcher.is_completed() or matcher.accept_token(256))
            if not done:
                where = _first_rejected_char(xgr, compiled, sample)
                print(f"FAIL xgrammar {case.name}#{i}: accept={ok} completed={done} "
                      f"rejected at char {where}: {sample[max(0, where - 30):where]!r} | {sample[where:where + 10]!r}")
                failures += 1
        print(f"ok   xgrammar {case.name}: {len(case.samples)} samples")
    return failures


def _byte_tokenizers():
    """xgrammar and llguidance tokenizers over the same 257-token vocabulary:
    one token per byte value plus an end-of-sequence token (id 256)."""
    import llguidance
    import xgrammar as xgr

    vocab = [bytes([i]) for i in range(256)] + [b"</s>"]

    class _ByteTok:
        eos_token_id = 256
        bos_token_id = None
        tokens = vocab
        special_token_ids = (256,)

        def __call__(self, s):
            return list(s if isinstance(s, bytes) else s.encode("utf-8"))

    xg_info = xgr.TokenizerInfo(vocab, xgr.VocabType.RAW, stop_token_ids=[256])
    ll_tok = llguidance.LLTokenizer(llguidance.TokenizerWrapper(_ByteTok()))
    return xg_info, ll_tok


def check_llguidance(cases, compare_masks: bool = True) -> int:
    """Each sample must be accepted by llguidance with the Lark twin; with
    ``compare_masks`` the set of allowed next bytes must also equal xgrammar's
    at every step (a strong check that the two grammars are the same language
    along the sample)."""
    import llguidance
    import llguidance.numpy as llnp
    import numpy as np
    import xgrammar as xgr
    from ebnf_to_lark import convert

    xg_info, ll_tok = _byte_tokenizers()
    compiler = xgr.GrammarCompiler(xg_info, max_threads=1)
    failures = 0
    for case in cases:
        conv = convert(case.ebnf)
        grammar = llguidance.LLMatcher.grammar_from_lark(conv.lark)
        compiled = compiler.compile_grammar(case.ebnf)
        mismatches = []
        bad = False
        for i, sample in enumerate(case.samples):
            m = llguidance.LLMatcher(ll_tok, grammar, log_level=0)
            if m.is_error():
                print(f"FAIL llguidance {case.name}: {m.get_error()}")
                bad = True
                break
            xm = xgr.GrammarMatcher(compiled)
            xg_mask = xgr.allocate_token_bitmask(1, 257)
            ll_mask = llnp.allocate_token_bitmask(1, 257)
            for pos, byte in enumerate(sample.encode("utf-8")):
                if compare_masks:
                    xm.fill_next_token_bitmask(xg_mask, 0)
                    llnp.fill_next_token_bitmask(m, ll_mask, 0)
                    a = np.unpackbits(np.asarray(xg_mask).view(np.uint8), bitorder="little")[:257]
                    b = np.unpackbits(ll_mask.view(np.uint8), bitorder="little")[:257]
                    if not np.array_equal(a, b) and len(mismatches) < 3:
                        diff = a ^ b
                        ids = np.flatnonzero(diff)[:8].tolist()
                        mismatches.append(f"#{i} byte {pos} ({sample.encode()[max(0, pos - 20):pos]!r}): "
                                          f"differ on {[bytes([t]) if t < 256 else 'EOS' for t in ids]}")
                    xm.accept_token(byte)
                if not m.consume_token(byte):
                    break
            if m.is_error() or not m.is_accepting():
                print(f"FAIL llguidance {case.name}#{i}: accepting={m.is_accepting()} err={m.get_error()[:300]}")
                bad = True
        if mismatches:
            kind = "NOTE" if conv.notes else "FAIL"
            print(f"{kind} masks differ xgrammar vs llguidance on {case.name} ({'; '.join(conv.notes) or 'unexpected'}):")
            for line in mismatches:
                print(f"       {line}")
            bad = bad or not conv.notes
        failures += int(bad)
        if not bad:
            print(f"ok   llguidance {case.name}: {len(case.samples)} samples"
                  + (", byte masks equal to xgrammar's" if compare_masks and not mismatches else ""))
    return failures


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--grammars", default="", help="comma-separated subset")
    ap.add_argument("--no-llguidance", action="store_true")
    args = ap.parse_args()
    cases = load_corpus([g for g in args.grammars.split(",") if g] or None)
    failures = check_xgrammar(cases)
    if not args.no_llguidance:
        failures += check_llguidance(cases)
    print("corpus OK" if failures == 0 else f"{failures} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
