"""The official JSON Schema Test Suite as JSONSchemaBench-shaped data, for `bench_jsonschema.py`.

Each test group of a draft's required tests (one file per keyword, e.g. ``anchor.json``) becomes a
record: its schema and its documents, labelled valid or invalid by the suite. A *compliant* record
in the benchmark's report is then a group fully right: compiled, every valid document accepted
to the end and every invalid one rejected. The suite is not in ``../shared``; it ships in the
`jsonschema` package's source distribution:

```sh
pip download jsonschema --no-deps --no-binary :all: -d /tmp/js && tar xzf /tmp/js/jsonschema-*.tar.gz -C /tmp/js
python benchmarks/schema_suite.py --suite /tmp/js/jsonschema-*/json/tests/draft2020-12 --out /tmp/suite
python benchmarks/bench_jsonschema.py --data /tmp/suite --subsets "$(cat /tmp/suite/SUBSETS)" \\
    --engines xg2,xg2-lenient,xgrammar,llguidance,llguidance-lenient --json suite.json
```

Groups that need a remote document (``refRemote.json`` and the like, whose ``$ref``s point at
``localhost:1234``) are left out, as is ``vocabulary.json`` (custom metaschemas); the count of
both is printed. Written to ``--out``: ``<keyword>.jsonl`` per file and ``SUBSETS`` (their names,
comma-separated).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

#: Files whose groups need documents fetched from a server, or metaschemas of their own.
SKIPPED_FILES = frozenset({"refRemote", "vocabulary"})


def _needs_remote(schema: object) -> bool:
    return "localhost:1234" in json.dumps(schema)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--suite", type=Path, required=True, help="a draft's directory of the test suite")
    ap.add_argument("--out", type=Path, required=True, help="where to write <keyword>.jsonl files")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    subsets, skipped, groups = [], 0, 0
    for path in sorted(args.suite.glob("*.json")):
        name = path.stem
        cases = json.loads(path.read_text(encoding="utf-8"))
        if name in SKIPPED_FILES:
            skipped += len(cases)
            continue
        lines = []
        for i, case in enumerate(cases):
            if _needs_remote(case["schema"]):
                skipped += 1
                continue
            tests = [{"data": t["data"], "valid": t["valid"], "description": t["description"]} for t in case["tests"]]
            lines.append(json.dumps({"id": f"{name}/{i}", "subset": name, "schema": case["schema"], "tests": tests,
                                     "description": case["description"]}, ensure_ascii=False))
        if lines:
            (args.out / f"{name}.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
            subsets.append(name)
            groups += len(lines)
    (args.out / "SUBSETS").write_text(",".join(subsets), encoding="utf-8")
    print(f"{groups} groups in {len(subsets)} files written to {args.out}; {skipped} groups left out "
          "(remote documents, custom vocabularies)")


if __name__ == "__main__":
    main()
