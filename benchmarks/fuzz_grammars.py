"""A seeded EBNF grammar fuzzer that counts hangs: random grammars in xgrammar's dialect, each
compiled with default options and walked token by token under a watchdog.

    python benchmarks/fuzz_grammars.py --n 300 --seed 1 [--tokenizer PATH] [--json OUT]

The generator (`generate`, `corpus`) writes small grammars of the kind fuzzing once found hanging
the compiler for minutes: 1-4 rules with self and mutual recursion, nullable rules, string literals
with escapes and non-ASCII text, character classes (negated ones and `[^]` included), groups,
alternation, `* + ?` and `{n}` `{n,}` `{n,m}` with bounds up to 1000, nested repetitions. A few
(`invalid_rate`) are deliberately broken, so that parse errors are fuzzed too. Every grammar comes
from its own `random.Random` seeded by (seed, index): case i of a run is reproduced alone with
`--only i`. Depth and node count are capped, so generating one costs microseconds.

Each case runs in a worker process (multiprocessing, spawn): a `GrammarCompiler` with default
options (`compile_timeout_ms` 5000, `fill_timeout_ms` 500), a fresh one per grammar by default so
that every case reproduces on its own (`--shared-compiler`: one compiler for all the grammars a
worker runs, as a server would), then a random walk of up to `--steps` tokens, each drawn uniformly
from the filled bitmask. The parent gives each case compile_timeout + steps x 2 fill_timeouts + a
margin of wall time; past that the case is a hang: the worker dumps its Python stacks
(faulthandler) and is killed, the case is reported with its grammar, and a new worker takes the
next case. Outcomes:

- ok: compiled and walked (to termination or the step limit)
- compile error <Class>: an `xg2.XG2Error` raised by the compile (typed: fine)
- fill timeout: `xg2.FillTimeoutError` during the walk (typed: fine)
- walk error <Class>: another `xg2.XG2Error` during the walk
- dead end: an empty mask before the matcher could end (fine when the grammar's language is empty)
- BUG untyped: any other exception (printed with the grammar and its traceback)
- BUG mask mismatch: `accept_token` refused a token its mask allowed
- BUG hang / BUG crash: the watchdog fired / the worker died

The exit status is 1 when any BUG outcome occurred.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import multiprocessing
import os
import random
import sys
import tempfile
import time
import traceback
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
DEFAULT_TOKENIZER = REPO.parent / "shared" / "tokenizers" / "deepseek_v3_tokenizer.json"

#: The grammar fuzzing found first (issue 34): building its first mask entry takes minutes.
HOSTILE = r'''root ::= (((("é"){5,40}){2})* | (((root | r1 | ""))*)+)
r1 ::= ((r2 (root | "" | [a-z]) | (("a" | "ab") | "a" "\n" [^]) | "é")){1,}
r2 ::= (("a" "é" "" root){0,3} | r1 ((r2){2}){0,1000} | r1 ([a-z]){2})
'''

#: The same rules behind a first byte: the first mask is cheap, the walk meets the explosion.
HOSTILE_LATER = r'''root ::= "\x01" h
h ::= (((("é"){5,40}){2})* | (((h | r1 | ""))*)+)
r1 ::= ((r2 (h | "" | [a-z]) | (("a" | "ab") | "a" "\n" [^]) | "é")){1,}
r2 ::= (("a" "é" "" h){0,3} | r1 ((r2){2}){0,1000} | r1 ([a-z]){2})
'''

KNOWN_CASES = (("hostile", HOSTILE), ("hostile-later", HOSTILE_LATER))

# --------------------------------------------------------------------------- generator

#: Literal pieces: a small alphabet most of the time (so that alternatives and repetitions overlap,
#: which is what makes Earley sets grow), sometimes escapes and wider characters.
_COMMON_CHARS = ("a", "a", "a", "b", "é", "é", "ab", "aé")
_RARE_CHARS = ("c", "z", "0", " ", "ü", "中", "😀", "\\n", "\\t", '\\"', "\\\\", "\\x41", "\\xe9",
               "\\u00e9", "\\u4e2d", "\\U0001F600", "\\/", "\\-", "\\[", "\\]")
#: Character class items: single characters and ranges (low <= high), escapes included.
_CLASS_ITEMS = ("a", "b", "é", "a-z", "a-c", "0-9", "A-Z", "é-ü", "\\n", "\\t", "\\-", "\\]", "\\\\",
                "\\x00-\\x7f", "\\u00e0-\\u00ff", "\\x80-\\U0010FFFF", "中-中", "^", " ")


@dataclass
class GenConfig:
    """Size caps of one generated grammar."""

    max_rules: int = 4
    max_depth: int = 4          # nesting of groups and repetitions
    max_nodes: int = 14         # atoms per rule body
    max_alts: int = 3
    max_seq: int = 3
    quant_rate: float = 0.35
    empty_rate: float = 0.08    # an "" alternative (a nullable rule)
    invalid_rate: float = 0.04  # a deliberately broken grammar (a parse error to type)


class _RuleWriter:
    def __init__(self, rng: random.Random, names: list[str], me: str, cfg: GenConfig):
        self.rng, self.names, self.me, self.cfg = rng, names, me, cfg
        self.nodes = 0

    def body(self, depth: int = 0) -> str:
        rng, cfg = self.rng, self.cfg
        n_alts = 1 if self.nodes >= cfg.max_nodes else rng.randint(1, cfg.max_alts)
        alts = [self.seq(depth) for _ in range(n_alts)]
        if rng.random() < cfg.empty_rate:
            alts.insert(rng.randrange(len(alts) + 1), '""')
        return " | ".join(alts)

    def seq(self, depth: int) -> str:
        n = 1 if self.nodes >= self.cfg.max_nodes else self.rng.randint(1, self.cfg.max_seq)
        return " ".join(self.item(depth) for _ in range(n))

    def item(self, depth: int) -> str:
        rng = self.rng
        text, composite = self.atom(depth)
        layers = 0
        while rng.random() < self.cfg.quant_rate and layers < 2 and depth + layers < self.cfg.max_depth:
            if composite:
                text = f"({text})"
            text += self.quantifier()
            composite = True     # a second quantifier needs parentheses: ((x){2}){0,1000}
            layers += 1
        return text

    def atom(self, depth: int) -> tuple[str, bool]:
        """(text, whether it needs parentheses before a quantifier)."""
        rng = self.rng
        self.nodes += 1
        leaf_only = depth >= self.cfg.max_depth or self.nodes >= self.cfg.max_nodes
        kinds = ["lit", "cls", "ref", "empty"] + ([] if leaf_only else ["group", "group"])
        weights = [28, 14, 24, 4] + ([] if leaf_only else [15, 15])
        kind = rng.choices(kinds, weights)[0]
        if kind == "lit":
            return self.literal(), False
        if kind == "cls":
            return self.char_class(), False
        if kind == "empty":
            return '""', False
        if kind == "ref":
            # Self-reference a third of the time; any rule otherwise (mutual recursion).
            return (self.me if rng.random() < 0.33 else rng.choice(self.names)), False
        return f"({self.body(depth + 1)})", False

    def literal(self) -> str:
        rng = self.rng
        n = rng.choice((1, 1, 1, 2, 2, 3))
        parts = [rng.choice(_RARE_CHARS) if rng.random() < 0.15 else rng.choice(_COMMON_CHARS) for _ in range(n)]
        return '"' + "".join(parts) + '"'

    def char_class(self) -> str:
        rng = self.rng
        negated = rng.random() < 0.35
        if negated and rng.random() < 0.3:
            return "[^]"
        items = [rng.choice(_CLASS_ITEMS) for _ in range(rng.randint(1, 3))]
        if not negated and items[0] == "^":
            items[0] = "\\^"
        return "[" + ("^" if negated else "") + "".join(items) + "]"

    def bound(self) -> int:
        r = self.rng.random()
        if r < 0.75:
            return self.rng.randint(0, 5)
        if r < 0.93:
            return self.rng.randint(6, 40)
        return self.rng.choice((100, 255, 500, 1000))

    def quantifier(self) -> str:
        rng = self.rng
        kind = rng.choices(("*", "+", "?", "{n}", "{n,}", "{n,m}"), (3, 3, 3, 2, 2, 4))[0]
        if kind in ("*", "+", "?"):
            return kind
        n = self.bound()
        if kind == "{n}":
            return f"{{{n}}}"
        if kind == "{n,}":
            return f"{{{n},}}"
        m = self.bound()
        lo, hi = min(n, m), max(n, m)
        return f"{{{lo},{hi}}}"


def _break(rng: random.Random, text: str) -> str:
    """One syntax or reference error, so that the parse errors are fuzzed as well."""
    how = rng.randrange(6)
    if how == 0:
        return text.replace("root ::=", "main ::=", 1)               # no root rule
    if how == 1:
        return text.rstrip("\n") + " undefined_rule\n"                 # an unknown reference
    if how == 2:
        return text.rstrip("\n") + " [z-a]\n"                          # a reversed range
    if how == 3:
        return text.rstrip("\n") + " \"a\"{5,2}\n"                     # bounds out of order
    if how == 4:
        return text.rstrip("\n") + ' "unterminated\n'
    return text.rstrip("\n") + " (\"a\" | )\n"                          # an empty alternative


def generate(seed: Any, cfg: GenConfig | None = None) -> str:
    """One grammar, a function of `seed` alone (any value `random.Random` takes)."""
    cfg = cfg or GenConfig()
    rng = random.Random(seed)
    names = ["root"] + [f"r{i}" for i in range(1, rng.randint(1, cfg.max_rules))]
    lines = [f"{name} ::= {_RuleWriter(rng, names, name, cfg).body()}" for name in names]
    text = "\n".join(lines) + "\n"
    if rng.random() < cfg.invalid_rate:
        text = _break(rng, text)
    return text


def case_seed(seed: int, index: int) -> str:
    return f"grammar-{seed}-{index}"


def corpus(n: int, seed: int, *, known: bool = True, cfg: GenConfig | None = None) -> list[tuple[str, str]]:
    """(name, grammar) pairs: the known hostile grammars first (when `known`), then `n` generated."""
    cases = list(KNOWN_CASES) if known else []
    cases += [(f"gen-{seed}-{i}", generate(case_seed(seed, i), cfg)) for i in range(n)]
    return cases


# --------------------------------------------------------------------------- one case


@dataclass
class CaseResult:
    index: int
    name: str
    grammar: str
    outcome: str                 # see OUTCOMES
    error_class: str = ""        # module.qualname of the exception
    error: str = ""
    traceback: str = ""
    typed: bool = True           # the exception (if any) is an xg2.XG2Error
    compile_s: float = 0.0
    fill_max_s: float = 0.0
    accept_max_s: float = 0.0
    fills: int = 0
    steps: int = 0
    terminated: bool = False
    wall_s: float = 0.0
    stage: str = ""              # where the exception came from: compile, fill, accept
    extra: dict = field(default_factory=dict)


OK, COMPILE_ERROR, FILL_TIMEOUT, WALK_ERROR, DEAD_END = "ok", "compile error", "fill timeout", "walk error", "dead end"
UNTYPED, MISMATCH, HANG, CRASH = "BUG untyped", "BUG mask mismatch", "BUG hang", "BUG crash"
BUGS = (UNTYPED, MISMATCH, HANG, CRASH)


def run_case(xg2: Any, info: Any, compiler: Any, index: int, name: str, grammar: str, walk_seed: Any,
             steps: int) -> CaseResult:
    """Compile `grammar` with `compiler` and walk it for at most `steps` tokens drawn from its masks."""
    import numpy as np

    res = CaseResult(index, name, grammar, OK)
    rng = random.Random(walk_seed)
    t_case = time.perf_counter()

    def failed(exc: BaseException, stage: str) -> None:
        res.stage = stage
        res.error_class = f"{type(exc).__module__}.{type(exc).__qualname__}"
        res.error = str(exc)[:2000]
        res.typed = isinstance(exc, xg2.XG2Error)
        if not res.typed:
            res.outcome = UNTYPED
            res.traceback = traceback.format_exc()
        elif stage == "compile":
            res.outcome = COMPILE_ERROR
        elif isinstance(exc, xg2.FillTimeoutError):
            res.outcome = FILL_TIMEOUT
        else:
            res.outcome = WALK_ERROR

    t0 = time.perf_counter()
    try:
        compiled = compiler.compile_grammar(grammar)
    except Exception as exc:   # noqa: BLE001 (every exception is an outcome to count)
        res.compile_s = time.perf_counter() - t0
        failed(exc, "compile")
        res.wall_s = time.perf_counter() - t_case
        return res
    res.compile_s = time.perf_counter() - t0

    vocab = info.vocab_size
    bitmask = xg2.allocate_token_bitmask(1, vocab)
    stage = "matcher"
    try:
        matcher = xg2.GrammarMatcher(compiled)
        for _ in range(steps):
            if matcher.is_terminated():
                break
            stage = "fill"
            t0 = time.perf_counter()
            res.fills += 1
            try:
                matcher.fill_next_token_bitmask(bitmask, 0)
            finally:        # a fill that raised counts too (a FillTimeoutError's time is the budget's)
                res.fill_max_s = max(res.fill_max_s, time.perf_counter() - t0)
            bits = np.unpackbits(bitmask[0].numpy().view(np.uint8), bitorder="little")[:vocab]
            allowed = np.flatnonzero(bits)
            if allowed.size == 0:
                res.outcome = DEAD_END
                res.extra["completed"] = bool(matcher.is_completed())
                break
            token = int(allowed[rng.randrange(allowed.size)])
            stage = "accept"
            t0 = time.perf_counter()
            try:
                took = matcher.accept_token(token)
            finally:
                res.accept_max_s = max(res.accept_max_s, time.perf_counter() - t0)
            if not took:
                res.outcome = MISMATCH
                res.extra.update(token=token, allowed=int(allowed.size), after_steps=res.steps)
                break
            res.steps += 1
        res.terminated = bool(matcher.is_terminated())
    except Exception as exc:   # noqa: BLE001
        failed(exc, stage)
    res.wall_s = time.perf_counter() - t_case
    return res


# --------------------------------------------------------------------------- the watchdog


def load_info(xg2: Any, vocab_spec: tuple) -> Any:
    """("hf", path) for a tokenizer.json, or ("raw", [bytes, ...], stop_ids) for a byte vocabulary."""
    if vocab_spec[0] == "hf":
        return xg2.TokenizerInfo.from_huggingface(str(vocab_spec[1]))
    if vocab_spec[0] == "raw":
        return xg2.TokenizerInfo(list(vocab_spec[1]), xg2.VocabType.RAW, stop_token_ids=list(vocab_spec[2]))
    raise ValueError(f"unknown vocabulary spec {vocab_spec[0]!r}")


def _worker(conn: Any, vocab_spec: tuple, options: dict, shared: bool, dump_path: str) -> None:
    sys.path.insert(0, str(REPO))
    import xg2

    info = load_info(xg2, vocab_spec)
    compiler = xg2.GrammarCompiler(info, **options) if shared else None
    xg2.allocate_token_bitmask(1, info.vocab_size)     # imports torch (2 s) before the first case's clock
    dump = open(dump_path, "w")   # noqa: SIM115 (faulthandler writes to it until the process ends)
    faulthandler.enable(file=dump)      # a crash leaves its stacks there too
    conn.send(("ready", os.getpid()))
    while True:
        msg = conn.recv()
        if msg is None:
            break
        index, name, grammar, walk_seed, steps, dump_after = msg
        dump.seek(0)
        dump.truncate()
        # A case that overruns leaves its stacks here before the parent kills this process.
        faulthandler.dump_traceback_later(dump_after, file=dump)
        try:
            c = compiler if shared else xg2.GrammarCompiler(info, **options)
            res = run_case(xg2, info, c, index, name, grammar, walk_seed, steps)
        finally:
            faulthandler.cancel_dump_traceback_later()
        conn.send(("done", asdict(res)))     # a dict: the parent may know this module by another name


class Runner:
    """Cases one at a time in a worker process; a case that overruns `limit_s` is a hang: the worker
    is killed (it is ours: `Process.kill`) and a new one takes the next case."""

    def __init__(self, vocab_spec: tuple, options: dict | None = None, *, shared: bool = False,
                 startup_timeout_s: float = 300.0):
        self.vocab_spec = vocab_spec
        self.options = dict(options or {})
        self.shared = shared
        self.startup_timeout_s = startup_timeout_s
        self._ctx = multiprocessing.get_context("spawn")
        self._proc: Any = None
        self._conn: Any = None
        fd, self._dump_path = tempfile.mkstemp(prefix="fuzz_grammars_", suffix=".stacks")
        os.close(fd)
        self.workers_started = 0

    def _start(self) -> None:
        parent, child = self._ctx.Pipe()
        proc = self._ctx.Process(target=_worker, daemon=True,
                                 args=(child, self.vocab_spec, self.options, self.shared, self._dump_path))
        try:
            proc.start()
        finally:
            child.close()
        self._proc, self._conn = proc, parent
        self.workers_started += 1
        if not parent.poll(self.startup_timeout_s):
            self._kill()
            raise RuntimeError(f"the fuzz worker did not start within {self.startup_timeout_s} s")
        try:
            parent.recv()
        except EOFError:
            code = self._proc.exitcode
            self._kill()
            raise RuntimeError(f"the fuzz worker died while starting (exit code {code})") from None

    def _kill(self) -> None:
        if self._proc is not None:
            if self._proc.is_alive():
                self._proc.kill()
            self._proc.join(10)
        if self._conn is not None:
            self._conn.close()
        self._proc = self._conn = None

    def run(self, index: int, name: str, grammar: str, walk_seed: Any, steps: int, limit_s: float) -> CaseResult:
        if self._proc is None:
            self._start()
        t0 = time.perf_counter()
        self._conn.send((index, name, grammar, walk_seed, steps, max(0.05, limit_s * 0.9)))
        if self._conn.poll(limit_s):
            try:
                _, res = self._conn.recv()
                return CaseResult(**res)
            except EOFError:
                wall = time.perf_counter() - t0
                self._proc.join(5)
                code = self._proc.exitcode
                stacks = self._read_stacks()
                self._kill()
                return CaseResult(index, name, grammar, CRASH, error=f"worker exit code {code}", traceback=stacks,
                                  typed=False, wall_s=wall, stage="worker died")
        wall = time.perf_counter() - t0
        time.sleep(min(1.0, 0.1 * limit_s))       # let faulthandler finish writing (it fired at 0.9 x limit)
        stacks = self._read_stacks()
        self._kill()
        return CaseResult(index, name, grammar, HANG, error=f"no result after {wall:.1f} s (limit {limit_s:.1f} s)",
                          traceback=stacks, typed=False, wall_s=wall, stage="killed by the watchdog")

    def _read_stacks(self) -> str:
        try:
            return Path(self._dump_path).read_text(errors="replace")
        except OSError:
            return ""

    def close(self) -> None:
        if self._conn is not None and self._proc is not None and self._proc.is_alive():
            try:
                self._conn.send(None)
                self._proc.join(10)
            except (OSError, BrokenPipeError):
                pass
        self._kill()
        try:
            os.unlink(self._dump_path)
        except OSError:
            pass


def case_limit_s(options: dict, steps: int, margin_s: float) -> float:
    """compile_timeout + steps x 2 fill_timeouts (a step's fill and its accept have a budget each,
    in CPU time) + margin, from the options or xg2's defaults."""
    from xg2.compiler import DEFAULT_COMPILE_TIMEOUT_MS, DEFAULT_FILL_TIMEOUT_MS

    compile_ms = options.get("compile_timeout_ms", DEFAULT_COMPILE_TIMEOUT_MS)
    fill_ms = options.get("fill_timeout_ms", DEFAULT_FILL_TIMEOUT_MS)
    if compile_ms is None or fill_ms is None:
        raise ValueError("a watchdog needs both deadlines: compile_timeout_ms and fill_timeout_ms set")
    return compile_ms / 1000 + steps * 2 * fill_ms / 1000 + margin_s


def run_corpus(cases: list[tuple[str, str]], vocab_spec: tuple, options: dict | None = None, *, seed: int = 0,
               steps: int = 30, limit_s: float | None = None, margin_s: float = 10.0, shared: bool = False,
               indices: list[int] | None = None, on_result: Any = None) -> list[CaseResult]:
    """Run `cases` ((name, grammar) pairs) under the watchdog; `on_result(result)` after each."""
    options = dict(options or {})
    limit = limit_s if limit_s is not None else case_limit_s(options, steps, margin_s)
    out = []
    runner = Runner(vocab_spec, options, shared=shared)
    try:
        for i, (name, grammar) in enumerate(cases):
            index = indices[i] if indices is not None else i
            res = runner.run(index, name, grammar, f"walk-{seed}-{name}", steps, limit)
            out.append(res)
            if on_result is not None:
                on_result(res)
    finally:
        runner.close()
    return out


# --------------------------------------------------------------------------- report


def outcome_key(res: CaseResult) -> str:
    if res.outcome in (COMPILE_ERROR, WALK_ERROR):
        return f"{res.outcome}: {res.error_class.rsplit('.', 1)[-1]}"
    return res.outcome


def summarize(results: list[CaseResult], options: dict | None = None) -> dict[str, Any]:
    """Counts by outcome, the maxima, and how many compiles and fills ran well past their budgets
    (finished, so not hangs, but the deadlines did not hold: past compile_timeout + 0.5 s, a fill
    past fill_timeout + 0.25 s)."""
    from xg2.compiler import DEFAULT_COMPILE_TIMEOUT_MS, DEFAULT_FILL_TIMEOUT_MS

    options = options or {}
    compile_ms = options.get("compile_timeout_ms", DEFAULT_COMPILE_TIMEOUT_MS)
    fill_ms = options.get("fill_timeout_ms", DEFAULT_FILL_TIMEOUT_MS)
    counts = Counter(outcome_key(r) for r in results)
    done = [r for r in results if r.outcome not in (HANG, CRASH)]
    late_compiles = [r.name for r in done if compile_ms is not None and r.compile_s > compile_ms / 1000 + 0.5]
    late_fills = [r.name for r in done if fill_ms is not None and r.fill_max_s > fill_ms / 1000 + 0.25]
    slowest = max(done, key=lambda r: r.compile_s, default=None)
    slowest_fill = max(done, key=lambda r: r.fill_max_s, default=None)
    return {
        "cases": len(results),
        "counts": dict(sorted(counts.items())),
        "bugs": sum(counts[k] for k in counts if k.startswith("BUG")),
        "max_compile_s": slowest.compile_s if slowest else 0.0,
        "max_compile_case": slowest.name if slowest else "",
        "max_fill_s": slowest_fill.fill_max_s if slowest_fill else 0.0,
        "max_fill_case": slowest_fill.name if slowest_fill else "",
        "max_accept_s": max((r.accept_max_s for r in done), default=0.0),
        "max_case_wall_s": max((r.wall_s for r in results), default=0.0),
        "late_compiles": late_compiles,
        "late_fills": late_fills,
        "fills": sum(r.fills for r in done),
        "tokens_accepted": sum(r.steps for r in done),
    }


def table(summary: dict[str, Any]) -> str:
    rows = ["| outcome | grammars |", "|---|---:|"]
    rows += [f"| {k} | {v} |" for k, v in summary["counts"].items()]
    rows.append(f"| **total** | {summary['cases']} |")
    return "\n".join(rows)


def describe_bug(res: CaseResult) -> str:
    lines = [f"=== {res.outcome}: case {res.index} ({res.name}), stage {res.stage or '?'}, {res.wall_s:.2f} s",
             res.grammar.rstrip("\n")]
    if res.error_class or res.error:
        lines.append(f"--- {res.error_class}: {res.error}")
    if res.extra:
        lines.append(f"--- {res.extra}")
    if res.traceback:
        lines.append(res.traceback.rstrip("\n"))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=300, help="generated grammars (the known hostile ones come on top)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--tokenizer", type=Path, default=DEFAULT_TOKENIZER)
    ap.add_argument("--json", type=Path, help="write every case's record and the summary here")
    ap.add_argument("--steps", type=int, default=30, help="tokens walked per grammar at most")
    ap.add_argument("--margin", type=float, default=10.0, help="seconds added to a case's deadlines")
    ap.add_argument("--shared-compiler", action="store_true", help="one compiler per worker, not one per grammar")
    ap.add_argument("--no-known", action="store_true", help="leave out the known hostile grammars")
    ap.add_argument("--only", nargs="+", metavar="NAME", help="run these cases only (e.g. gen-1-17 hostile)")
    ap.add_argument("--print", action="store_true", help="print the grammars and exit")
    args = ap.parse_args(argv)

    cases = corpus(args.n, args.seed, known=not args.no_known)
    indices = list(range(len(cases)))
    if args.only:
        unknown = set(args.only) - {name for name, _ in cases}
        if unknown:
            ap.error(f"no such case: {sorted(unknown)} (names are hostile, hostile-later, gen-SEED-I with I < --n)")
        indices = [i for i, (name, _) in enumerate(cases) if name in args.only]
        cases = [cases[i] for i in indices]
    if args.print:
        for name, text in cases:
            print(f"# {name}\n{text}")
        return 0

    options: dict = {}      # xg2's defaults: compile_timeout_ms 5000, fill_timeout_ms 500
    limit = case_limit_s(options, args.steps, args.margin)
    print(f"{len(cases)} grammars (seed {args.seed}), tokenizer {args.tokenizer.name}, "
          f"{'a shared compiler' if args.shared_compiler else 'a new compiler per grammar'} with default options, "
          f"walks of <= {args.steps} tokens, watchdog {limit:.1f} s a case", flush=True)
    t_start = time.perf_counter()
    progress = {"n": 0}

    def on_result(res: CaseResult) -> None:
        progress["n"] += 1
        if res.outcome in BUGS:
            print(describe_bug(res), flush=True)
        if progress["n"] % 25 == 0 or progress["n"] == len(cases):
            print(f"  {progress['n']}/{len(cases)} done, {time.perf_counter() - t_start:.0f} s", flush=True)

    results = run_corpus(cases, ("hf", str(args.tokenizer)), options, seed=args.seed, steps=args.steps,
                         limit_s=limit, shared=args.shared_compiler, indices=indices, on_result=on_result)
    elapsed = time.perf_counter() - t_start
    summary = summarize(results, options)
    summary.update(elapsed_s=elapsed, seed=args.seed, n=args.n, steps=args.steps, limit_s=limit,
                   tokenizer=str(args.tokenizer), shared_compiler=args.shared_compiler)
    print()
    print(table(summary))
    print()
    print(f"max compile {summary['max_compile_s']:.2f} s ({summary['max_compile_case']}), "
          f"max fill {summary['max_fill_s']:.3f} s ({summary['max_fill_case']}), "
          f"max accept {summary['max_accept_s']:.3f} s, max case wall {summary['max_case_wall_s']:.2f} s; "
          f"{summary['fills']} fills, {summary['tokens_accepted']} tokens accepted; {elapsed:.0f} s in all")
    print(f"past their budget (not hangs): {len(summary['late_compiles'])} compiles > deadline + 0.5 s "
          f"{summary['late_compiles']}, {len(summary['late_fills'])} walks with a fill > fill budget + 0.25 s "
          f"{summary['late_fills']}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"summary": summary, "cases": [asdict(r) for r in results]}, indent=1,
                                        ensure_ascii=False))
    if summary["bugs"]:
        print(f"{summary['bugs']} BUG outcome(s): see above", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
