"""How much of xgrammar's own Python test suite passes on xg2, through an import shim.

    python benchmarks/xgrammar_suite.py --tests PATH/TO/xgrammar/tests/python [--deselect-ebnf-printing]

``--tests`` is a copy of xgrammar's ``tests/python`` (the one of the installed xgrammar's version:
its sdist ships it). pytest runs it twice with the same selection, each with ``--junitxml``:

1. against the real ``xgrammar`` installed in this environment (the baseline);
2. with ``benchmarks/xgrammar_shim`` first on ``PYTHONPATH``, so ``import xgrammar`` is xg2.

It prints the tests passed on xgrammar, how many of those pass on xg2 (the ratio), the top failure
groups on xg2 (exception type and the first 80 characters of the message's first line, with
example test ids), and the xgrammar API names the failing tests needed that xg2 lacks (from
AttributeError / ImportError / TypeError-on-signature / the shim's NotImplementedError messages),
with the count of baseline-passing tests each blocks. A test file that does not import on xg2 (a
collection error) counts as a failure of every baseline-passing test in it, with that error as the
reason. Both runs get ``HF_HUB_OFFLINE=1`` (no Hub downloads here) and, by default, ``-m "not
hf_token_required"`` (the suite's marker for gated Hugging Face models; its conftest skips them
anyway without a token). A per-test alarm (``--per-test-timeout``, 120 s) fails a test that runs
too long instead of losing the whole run.

``--deselect-ebnf-printing``: sets aside, in both runs (pytest deselects them), the tests that check
xgrammar's exact *printed* EBNF, which another engine's printer cannot reproduce however correct
its grammars are (rule names, bracketing, the order of rules, normalisation passes). The set is
found statically, before running, from the test files' source (``ast``), not from how xg2 fails:

* a *printed-grammar expression* is a call of ``str(...)`` / ``repr(...)`` / ``X.to_string()`` /
  ``print(...)`` of anything but an exception (``str(e)``, ``str(exc_info.value)`` and the like are
  excluded), or of the suite's EBNF printers ``_json_schema_to_ebnf``, ``_regex_to_ebnf``,
  ``_print_grammar_fsms``; a local name assigned from one is one too;
* a function *compares printed grammar* if it has an ``assert`` whose test is a comparison
  (``==``, ``!=``, ``in``, ``not in``) with a printed-grammar expression on one side and an
  expression that is not one on the other (so ``str(g1) == str(g2)`` round trips, which another
  engine can satisfy with its own printer, do not count);
* a test is set aside if its function compares printed grammar, or calls (by name) a module-level
  helper of its file that does (e.g. ``check_stag_with_grammar``), directly or through other
  helpers of the file (any depth).

This is the test-name-independent form of "the test asserts on ``str(grammar)`` against an
expected EBNF text". It also catches tests that check a rule name is present in the printed text
(``"root ::=" in str(g)``), which depend on xgrammar's rule naming just the same. Tests that print
a grammar only to parse it again (round trips) are not caught: they do not compare the text. The
selected (file, function) pairs are written to ``ebnf_printing.json`` in the output directory.

``--reuse`` reads the two junit files already in ``--out`` instead of running pytest again.
``--xg2-path DIR`` measures the xg2 of another checkout (say a clone of one commit, with its
extensions built in place: ``python setup.py build_ext --inplace``) instead of the installed one;
the report names the checkout, its commit, and whether it had uncommitted changes.
"""

from __future__ import annotations

import argparse
import ast
import collections
import json
import os
import re
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

HERE = Path(__file__).resolve().parent
SHIM_DIR = HERE / "xgrammar_shim"

# A pytest plugin written into the output directory and loaded with -p: exact deselection of the
# printed-EBNF tests (by file name and test function name, all parametrisations), and a per-test
# alarm.
# With --xg2-path, the installed xg2's editable-install finder is taken off sys.meta_path, so that a
# module the given checkout lacks is not found in the installed tree instead.
ISOLATE = ("import os, sys\n"
           "if os.environ.get('XG2_SUITE_ISOLATE'):\n"
           "    sys.meta_path[:] = [f for f in sys.meta_path\n"
           "                        if not str(getattr(f, '__module__', '')).startswith('__editable__')]\n")

PLUGIN_SOURCE = ISOLATE + '''
import json, os, signal
import pytest

_DESELECT = set()
_path = os.environ.get("XG2_SUITE_DESELECT")
if _path:
    _DESELECT = {tuple(x) for x in json.load(open(_path))}
_TIMEOUT = int(os.environ.get("XG2_SUITE_TEST_TIMEOUT", "0"))


class PerTestTimeout(Exception):
    pass


def pytest_collection_modifyitems(config, items):
    if not _DESELECT:
        return
    keep, drop = [], []
    for item in items:
        name = getattr(item, "originalname", None) or item.name.split("[")[0]
        (drop if (item.path.name, name) in _DESELECT else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def _alarm(signum, frame):
    raise PerTestTimeout(f"test ran past {_TIMEOUT} s (xgrammar_suite per-test timeout)")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    if _TIMEOUT > 0:
        old = signal.signal(signal.SIGALRM, _alarm)
        signal.alarm(_TIMEOUT)
    try:
        yield
    finally:
        if _TIMEOUT > 0:
            signal.alarm(0)
            signal.signal(signal.SIGALRM, old)
'''

PRINTERS = {"_json_schema_to_ebnf", "_regex_to_ebnf", "_print_grammar_fsms"}
EXC_NAMES = re.compile(r"^(e|ex|exc|err|error|excinfo|exc_info|exception|w|warning|record)\d*$")


# ------------------------------------------------------------------------------------------------
# Static detection of printed-EBNF comparisons.

def _call_name(node: ast.AST) -> str | None:
    if isinstance(node, ast.Call):
        f = node.func
        if isinstance(f, ast.Name):
            return f.id
        if isinstance(f, ast.Attribute):
            return f.attr
    return None


def _is_exception_like(node: ast.AST) -> bool:
    if isinstance(node, ast.Attribute) and node.attr in {"value", "message", "args"}:
        return True
    return isinstance(node, ast.Name) and bool(EXC_NAMES.match(node.id))


class _FunctionScan(ast.NodeVisitor):
    def __init__(self) -> None:
        self.printed_names: set[str] = set()
        self.compares_printed = False
        self.called: set[str] = set()

    def is_printed(self, node: ast.AST) -> bool:
        for sub in ast.walk(node):
            name = _call_name(sub)
            if name in PRINTERS:
                return True
            if (name in {"str", "repr"} and isinstance(sub.func, ast.Name) and sub.args
                    and not _is_exception_like(sub.args[0])):
                return True
            if name == "to_string" and isinstance(sub.func, ast.Attribute):
                return True
            if isinstance(sub, ast.Name) and sub.id in self.printed_names:
                return True
        return False

    def visit_Assign(self, node: ast.Assign) -> None:
        if self.is_printed(node.value):
            for t in node.targets:
                for n in ast.walk(t):
                    if isinstance(n, ast.Name):
                        self.printed_names.add(n.id)
        self.generic_visit(node)

    def visit_Assert(self, node: ast.Assert) -> None:
        test = node.test
        if isinstance(test, ast.Compare) and any(
            isinstance(op, (ast.Eq, ast.NotEq, ast.In, ast.NotIn)) for op in test.ops
        ):
            printed = [self.is_printed(side) for side in [test.left, *test.comparators]]
            if any(printed) and not all(printed):  # printed text against expected text
                self.compares_printed = True
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        name = _call_name(node)
        if name:
            self.called.add(name)
        self.generic_visit(node)


def _scan(fn: ast.AST) -> _FunctionScan:
    scan = _FunctionScan()
    # Two passes so that a name assigned after an earlier use (loops) is known.
    for _ in range(2):
        scan.compares_printed = False
        scan.visit(fn)
    return scan


def find_ebnf_printing_tests(tests_dir: Path) -> list[tuple[str, str]]:
    """(file name, test function name) of the tests that compare printed grammar text."""
    found: list[tuple[str, str]] = []
    for path in sorted(tests_dir.glob("test_*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        funcs: dict[str, ast.AST] = {}
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                funcs[node.name] = node
            elif isinstance(node, ast.ClassDef):
                for sub in node.body:
                    if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef)) and sub.name.startswith("test"):
                        funcs[sub.name] = sub
        scans = {n: _scan(f) for n, f in funcs.items()}
        # Helpers that compare printed grammar, directly or through other helpers of the file (a
        # fixed point over the file's call graph, so a check two calls down still counts).
        helpers = {n for n, s in scans.items() if not n.startswith("test") and s.compares_printed}
        grew = True
        while grew:
            grew = False
            for n, s in scans.items():
                if n not in helpers and not n.startswith("test") and s.called & helpers:
                    helpers.add(n)
                    grew = True
        for name, scan in scans.items():
            if not name.startswith("test"):
                continue
            if scan.compares_printed or scan.called & helpers:
                found.append((path.name, name))
    return found


# ------------------------------------------------------------------------------------------------
# Running pytest and reading junit.

def run_pytest(label: str, tests_dir: Path, out_dir: Path, junit: Path, markexpr: str, shim: bool,
               deselect_file: Path | None, per_test_timeout: int, total_timeout: int,
               extra: list[str], xg2_path: Path | None = None) -> float:
    env = dict(os.environ)
    env["HF_HUB_OFFLINE"] = "1"
    env["TRANSFORMERS_OFFLINE"] = "1"
    env["XG2_SUITE_TEST_TIMEOUT"] = str(per_test_timeout)
    pp = [str(out_dir)]  # the plugin
    if shim:
        pp.insert(0, str(SHIM_DIR))
        if xg2_path is not None:  # a given xg2 checkout (its extensions built in place) before the installed one
            pp.insert(1, str(xg2_path))
            env["XG2_SUITE_ISOLATE"] = "1"
    if env.get("PYTHONPATH"):
        pp.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(pp)
    if not (shim and xg2_path is not None):
        env.pop("XG2_SUITE_ISOLATE", None)
    if deselect_file is not None:
        env["XG2_SUITE_DESELECT"] = str(deselect_file)
    else:
        env.pop("XG2_SUITE_DESELECT", None)
    probe = (ISOLATE + "import xgrammar, sys; print(xgrammar.__file__, end='')\n"
             "if 'xg2' in sys.modules: print(' (xg2 from', sys.modules['xg2'].__file__ + ')', end='')\nprint()")
    check = subprocess.run([sys.executable, "-c", probe],
                           env=env, cwd=str(tests_dir.parent), capture_output=True, text=True, check=False)
    print(f"[{label}] xgrammar is {check.stdout.strip() or check.stderr.strip()[-200:]}", flush=True)
    if shim and str(SHIM_DIR) not in check.stdout:
        raise SystemExit("the shim does not shadow xgrammar; is the shim directory right?")
    cmd = [sys.executable, "-m", "pytest", str(tests_dir), "-q", "-p", "no:cacheprovider",
           "-p", "_xg2_suite_plugin", "-o", "junit_family=xunit1", f"--junitxml={junit}",
           "--continue-on-collection-errors"]
    if markexpr:
        cmd += ["-m", markexpr]
    cmd += extra
    log = junit.with_suffix(".log")
    print(f"[{label}] {' '.join(cmd)}  (log: {log})", flush=True)
    t0 = time.time()
    with open(log, "w") as fh:
        try:
            subprocess.run(cmd, env=env, cwd=str(tests_dir.parent), stdout=fh, stderr=subprocess.STDOUT,
                           timeout=total_timeout, check=False)
        except subprocess.TimeoutExpired:
            print(f"[{label}] pytest ran past {total_timeout} s and was stopped", flush=True)
    dt = time.time() - t0
    tail = log.read_text(errors="replace").strip().splitlines()[-1:] or [""]
    print(f"[{label}] {tail[0]}  ({dt:.0f} s)", flush=True)
    return dt


class Outcome:
    __slots__ = ("etype", "message", "status", "text")

    def __init__(self, status: str, etype: str = "", message: str = "", text: str = ""):
        self.status, self.etype, self.message, self.text = status, etype, message, text


_TYPE_RE = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Warning|Exit|Interrupt|Timeout|Failed|Iteration)|Failed|"
                      r"AssertionError|NotImplementedError|StopIteration)(?::\s?|$)")


def _split_message(message: str, text: str) -> tuple[str, str]:
    first = (message or "").strip().splitlines()[0] if (message or "").strip() else ""
    m = _TYPE_RE.match(first)
    if m:
        etype = m.group(1).rsplit(".", 1)[-1]
        return etype, first[m.end():].strip()
    # junit's message was not "Type: text"; take the "E   Type: text" line of the traceback.
    for line in (text or "").splitlines():
        s = line.strip()
        if s.startswith("E ") and ":" in s:
            cand = s[1:].strip()
            m = _TYPE_RE.match(cand)
            if m:
                return m.group(1).rsplit(".", 1)[-1], cand[m.end():].strip()
    if first.startswith("assert "):
        return "AssertionError", first
    return "(unknown)", first


def read_junit(path: Path) -> tuple[dict[str, Outcome], dict[str, Outcome]]:
    """({test id: outcome}, {test module (dotted, as in classname): collection error})."""
    tests: dict[str, Outcome] = {}
    collection: dict[str, Outcome] = {}
    if not path.exists():
        return tests, collection
    root = ET.parse(path).getroot()
    for case in root.iter("testcase"):
        classname = case.get("classname", "")
        name = case.get("name", "")
        status, etype, msg, text = "passed", "", "", ""
        for child in case:
            if child.tag in ("failure", "error"):
                status = "failed" if child.tag == "failure" else "error"
                text = child.text or ""
                etype, msg = _split_message(child.get("message", ""), text)
                break
            if child.tag == "skipped":
                status = "skipped"
                msg = child.get("message", "")
        if not classname and status == "error":  # a collection error: name is the module
            collection[name] = Outcome("error", etype, msg, text)
            continue
        tests[f"{classname}::{name}"] = Outcome(status, etype, msg, text)
    return tests, collection


def _module_of(test_id: str) -> str:
    classname = test_id.split("::", 1)[0]
    parts = classname.split(".")
    for i in range(len(parts), 0, -1):  # test classes: drop trailing capitalised parts
        if parts[i - 1].startswith("test_"):
            return ".".join(parts[:i])
    return classname


# ------------------------------------------------------------------------------------------------
# Missing API names.

_MISSING_PATTERNS = [
    (re.compile(r"type object '(\w+)' has no attribute '(\w+)'"), lambda m: f"{m[1]}.{m[2]}"),
    (re.compile(r"module '([\w.]+)' has no attribute '(\w+)'"), lambda m: f"{m[1]}.{m[2]}"),
    (re.compile(r"'(\w+)' object has no attribute '(\w+)'"), lambda m: f"{m[1]}.{m[2]}"),
    (re.compile(r"cannot import name '(\w+)' from '([\w.]+)'"), lambda m: f"{m[2]}.{m[1]}"),
    (re.compile(r"No module named '([\w.]+)'"), lambda m: f"{m[1]} (module)"),
    (re.compile(r"(xgrammar\.testing\.[\w.]+) is not available"), lambda m: m[1]),
    (re.compile(r"(xgrammar\.testing\._json_schema_to_ebnf\(json_format=[^)]*\))"), lambda m: m[1]),
    (re.compile(r"([\w.]+)\(\) got an unexpected keyword argument '(\w+)'"), lambda m: f"{m[1]}(..., {m[2]}=)"),
    (re.compile(r"([\w.]+)\(\) takes (?:from )?\d+ (?:to \d+ )?positional arguments? but \d+ (?:were|was) given"),
     lambda m: f"{m[1]}(extra positional args)"),
    (re.compile(r"([\w.]+)\(\) missing \d+ required positional argument"), lambda m: f"{m[1]}(signature)"),
]
_BUILTIN_TYPES = {"int", "str", "list", "dict", "tuple", "bytes", "NoneType", "float", "bool"}
_SHIM_MODULE_NAMES = {"xg2.grammar.structural_tag": "xgrammar.structural_tag"}


def missing_api_name(o: Outcome) -> str | None:
    if o.etype not in {"AttributeError", "ImportError", "ModuleNotFoundError", "TypeError",
                       "NotImplementedError"}:
        return None
    for rx, fmt in _MISSING_PATTERNS:
        m = rx.search(o.message) or rx.search(o.text or "")
        if m and m.groups() and m[1] in _BUILTIN_TYPES:
            continue  # "'int' object has no attribute ...": a call of another shape, not a name
        if m:
            name = fmt(m)
            for a, b in _SHIM_MODULE_NAMES.items():
                name = name.replace(a, b)
            return name
    return None


# ------------------------------------------------------------------------------------------------

IMPORT_CHECK = r"""
import ast, importlib, json, sys
from pathlib import Path
out = []
for path in sorted(Path(sys.argv[1]).glob("*.py")):
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "xgrammar":
            try:
                mod = importlib.import_module(node.module)
            except ImportError:
                out.append([path.name, node.module, ["(module)"]])
                continue
            missing = [a.name for a in node.names if not hasattr(mod, a.name)]
            if missing:
                out.append([path.name, node.module, missing])
print(json.dumps(out))
"""


def shim_import_gaps(tests_dir: Path, xg2_path: Path | None = None) -> list:
    """[file, module, [names]] of the `from xgrammar... import` statements the shim cannot satisfy."""
    env = dict(os.environ)
    pp = [str(SHIM_DIR)] + ([str(xg2_path)] if xg2_path else []) + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
    env["PYTHONPATH"] = os.pathsep.join(pp)
    if xg2_path:
        env["XG2_SUITE_ISOLATE"] = "1"
    r = subprocess.run([sys.executable, "-c", ISOLATE + IMPORT_CHECK, str(tests_dir)], env=env, capture_output=True,
                       text=True, cwd=str(tests_dir.parent), check=False)
    try:
        return json.loads(r.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return []


def xg2_provenance(xg2_path: Path | None) -> str:
    """The xg2 checkout measured: its commit, and whether its work tree had uncommitted changes."""
    root = xg2_path or HERE.parent
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no", "--", "xg2"],
                               capture_output=True, text=True, check=False).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return f"{root} (not a git checkout)"
    return f"{root} at {head}" + (" plus uncommitted changes under xg2/" if dirty else "")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tests", required=True, type=Path, help="a copy of xgrammar's tests/python")
    ap.add_argument("--out", type=Path, default=None, help="output directory (default: TESTS/../xg2_suite_out)")
    ap.add_argument("--deselect-ebnf-printing", action="store_true",
                    help="set aside the tests that compare xgrammar's exact printed EBNF (see the module doc)")
    ap.add_argument("-m", "--markexpr", default="not hf_token_required",
                    help='pytest -m expression for both runs (default: "not hf_token_required"; "" for none)')
    ap.add_argument("--per-test-timeout", type=int, default=120)
    ap.add_argument("--run-timeout", type=int, default=900, help="seconds for one pytest run")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--reuse", action="store_true", help="read the junit files in --out, do not run pytest")
    ap.add_argument("--reuse-baseline", action="store_true",
                    help="run only xg2's side when --out already holds xgrammar's junit file")
    ap.add_argument("--xg2-path", type=Path, default=None,
                    help="measure the xg2 of this checkout (extensions built in place, e.g. a clone of one "
                         "commit) instead of the installed one")
    ap.add_argument("--json", type=Path, default=None, help="also write the figures as JSON here")
    ap.add_argument("pytest_args", nargs="*", help="extra pytest arguments (after --)")
    args = ap.parse_args()

    tests_dir = args.tests.resolve()
    if not tests_dir.is_dir():
        raise SystemExit(f"--tests {tests_dir} is not a directory")
    out = (args.out or tests_dir.parent / "xg2_suite_out").resolve()
    out.mkdir(parents=True, exist_ok=True)
    (out / "_xg2_suite_plugin.py").write_text(PLUGIN_SOURCE)
    tag = "_noebnf" if args.deselect_ebnf_printing else ""
    base_xml, xg2_xml = out / f"baseline{tag}.xml", out / f"xg2{tag}.xml"

    deselect_file = None
    printing: list[tuple[str, str]] = []
    if args.deselect_ebnf_printing:
        printing = find_ebnf_printing_tests(tests_dir)
        deselect_file = out / "ebnf_printing.json"
        deselect_file.write_text(json.dumps(printing, indent=1))
        print(f"printed-EBNF tests set aside: {len(printing)} test functions in "
              f"{len({f for f, _ in printing})} files (list: {deselect_file})")

    xg2_path = args.xg2_path.resolve() if args.xg2_path else None
    print(f"xg2 measured: {xg2_provenance(xg2_path)}")
    if not args.reuse:
        for label, xml, shim in (("xgrammar", base_xml, False), ("xg2", xg2_xml, True)):
            if label == "xgrammar" and args.reuse_baseline and xml.exists():
                continue        # xgrammar's side does not change between xg2 commits
            run_pytest(label, tests_dir, out, xml, args.markexpr, shim, deselect_file,
                       args.per_test_timeout, args.run_timeout, args.pytest_args, xg2_path)

    base, base_coll = read_junit(base_xml)
    mine, mine_coll = read_junit(xg2_xml)
    passed_base = sorted(t for t, o in base.items() if o.status == "passed")
    counts = collections.Counter(o.status for o in base.values())
    print()
    print(f"baseline (real xgrammar): {counts['passed']} passed, {counts['failed']} failed, "
          f"{counts['error']} errors, {counts['skipped']} skipped; collection errors: {len(base_coll)}")
    mcounts = collections.Counter(o.status for o in mine.values())
    print(f"xg2 (shim):               {mcounts['passed']} passed, {mcounts['failed']} failed, "
          f"{mcounts['error']} errors, {mcounts['skipped']} skipped; collection errors: {len(mine_coll)} "
          f"({', '.join(sorted(mine_coll)) or '-'})")

    results: dict[str, Outcome] = {}
    for t in passed_base:
        o = mine.get(t)
        if o is None:
            mod = _module_of(t)
            o = mine_coll.get(mod) or Outcome("missing", "(id not in xg2 run)",
                                                "no test of this id in the xg2 run (parametrize ids that print engine objects)")
            if o.status == "error" and mod in mine_coll:
                o = Outcome("collection", o.etype, o.message, o.text)
        results[t] = o
    ok = sum(1 for o in results.values() if o.status == "passed")
    n = len(passed_base)
    print(f"\nof the {n} tests that pass on xgrammar, {ok} pass on xg2: "
          f"{ok / n:.1%}" if n else "\nno test passed on xgrammar")

    failing = {t: o for t, o in results.items() if o.status != "passed"}
    by_status = collections.Counter(o.status for o in failing.values())
    print(f"not passing on xg2: {len(failing)} ({dict(by_status)})")

    groups: dict[tuple[str, str], list[str]] = collections.defaultdict(list)
    for t, o in failing.items():
        key = (("collection: " if o.status == "collection" else "") + (o.etype or o.status),
               (o.message or "").splitlines()[0][:80] if o.message else "")
        groups[key].append(t)
    print(f"\ntop {args.top} failure groups on xg2 (exception type | message prefix, 80 chars):")
    for i, ((etype, prefix), ids) in enumerate(sorted(groups.items(), key=lambda kv: -len(kv[1]))[: args.top], 1):
        print(f"{i:3d}. {len(ids):5d}  {etype} | {prefix}")
        for ex in ids[:2]:
            print(f"             e.g. {ex}")

    by_type = collections.Counter(o.etype or o.status for o in failing.values())
    print("\nby exception type: " + ", ".join(f"{k} {v}" for k, v in by_type.most_common()))

    missing: dict[str, list[str]] = collections.defaultdict(list)
    for t, o in failing.items():
        name = missing_api_name(o)
        if name:
            missing[name].append(t)
    print("\nxgrammar API names the failing tests needed that xg2 lacks (tests blocked):")
    for name, ids in sorted(missing.items(), key=lambda kv: -len(kv[1])):
        print(f"  {len(ids):5d}  {name}   e.g. {ids[0]}")

    gaps = shim_import_gaps(tests_dir, xg2_path)
    if gaps:
        print("\n`from xgrammar... import` statements xg2 cannot satisfy (file: module: names):")
        for fname, module, names in gaps:
            print(f"  {fname}: {module}: {', '.join(names)}")

    if args.json:
        args.json.write_text(json.dumps({
            "baseline_passed": n, "xg2_passed_of_those": ok, "ratio": ok / n if n else None,
            "deselect_ebnf_printing": args.deselect_ebnf_printing,
            "ebnf_printing_functions": len(printing),
            "groups": [{"type": k[0], "prefix": k[1], "count": len(v), "examples": v[:5]}
                       for k, v in sorted(groups.items(), key=lambda kv: -len(kv[1]))],
            "missing_api": {k: len(v) for k, v in missing.items()},
        }, indent=1))


if __name__ == "__main__":
    main()
