"""Loader for the EBNF grammar corpus in ``benchmarks/grammars``.

Each grammar ``NAME`` is a pair of files:

* ``NAME.ebnf`` -- the grammar in xgrammar's EBNF dialect (root rule ``root``);
* ``NAME.samples.txt`` -- valid documents separated by lines holding exactly
  ``=====``.  Every sample keeps the newline that ends its last line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

GRAMMAR_DIR = Path(__file__).resolve().parent / "grammars"
SAMPLE_SEPARATOR = re.compile(r"^=====\n", re.MULTILINE)


@dataclass(frozen=True)
class GrammarCase:
    name: str
    ebnf: str
    samples: tuple[str, ...]


def grammar_names(directory: Path = GRAMMAR_DIR) -> list[str]:
    return sorted(p.name[: -len(".ebnf")] for p in directory.glob("*.ebnf"))


def read_samples(path: Path) -> tuple[str, ...]:
    text = path.read_text(encoding="utf-8")
    return tuple(part for part in SAMPLE_SEPARATOR.split(text) if part)


def load_case(name: str, directory: Path = GRAMMAR_DIR) -> GrammarCase:
    ebnf = (directory / f"{name}.ebnf").read_text(encoding="utf-8")
    samples = read_samples(directory / f"{name}.samples.txt")
    return GrammarCase(name=name, ebnf=ebnf, samples=samples)


def load_corpus(names: list[str] | None = None, directory: Path = GRAMMAR_DIR) -> list[GrammarCase]:
    available = grammar_names(directory)
    if names:
        unknown = sorted(set(names) - set(available))
        if unknown:
            raise SystemExit(f"unknown grammar(s): {', '.join(unknown)}; available: {', '.join(available)}")
        available = [n for n in available if n in names]
    return [load_case(n, directory) for n in available]
