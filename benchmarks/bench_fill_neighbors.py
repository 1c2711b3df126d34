"""How much a busy neighbour on the other core slows warm fills, whatever it is doing: the control
for bench_fill_isolation's `beside` figure.

    python benchmarks/bench_fill_neighbors.py [--tokenizer PATH] [--runs 7]

The EBNF corpus's grammars (those whose warm fills are a few microseconds) are compiled once with
`background_precompute=False`, their samples replayed until every entry is built, and then replayed
again, timing only `fill_next_token_bitmask`, in four conditions: nothing beside; a child process
spinning in Python (it holds a core and little memory); one summing a 64 MiB array (memory
bandwidth); one summing a 4 MiB array over and over (it keeps the shared last-level cache busy, as
an entry build's trie walk does). No thread of this process runs beside the fills in any of them,
so no lock or GIL is shared: what is left is the machine's own sharing between its cores.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(1, str(HERE.parent))

from bench_fill_isolation import ebnf_cases, replay
from engines import DEFAULT_TOKENIZER, load_vocab

#: Grammars left out: their fills are dominated by per-token parser work, not by the entries.
SLOW = {"ambiguous", "markdown_outline", "sexpr", "sql_select", "unicode"}
NEIGHBOURS = {
    "python spin": "while True: pass",
    "64 MiB sums": "import numpy as np\na = np.ones(64 << 20, np.uint8)\nwhile True: a.sum()",
    "4 MiB sums": "import numpy as np\na = np.ones(4 << 20, np.uint8)\nwhile True: a.sum()",
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokenizer", type=Path, default=DEFAULT_TOKENIZER)
    ap.add_argument("--runs", type=int, default=7, help="replays of the whole set per condition (median)")
    args = ap.parse_args(argv)

    import xg2

    vocab = load_vocab(args.tokenizer)
    info = xg2.TokenizerInfo.from_huggingface(str(vocab.path))
    bitmask = xg2.allocate_token_bitmask(1, info.vocab_size)
    compiler = xg2.GrammarCompiler(info, background_precompute=False)
    grammars = []
    for case in ebnf_cases(vocab):
        if case["name"] in SLOW:
            continue
        compiled = compiler.compile_grammar(case["source"])
        for _ in range(3):      # every entry the samples reach built
            replay(xg2, compiled, case["samples"], bitmask)
        grammars.append((compiled, case["samples"]))

    def mean_us() -> float:
        """The mean over grammars of each grammar's mean fill, median over runs."""
        return statistics.median(
            statistics.fmean(statistics.fmean(replay(xg2, g, s, bitmask)) for g, s in grammars) * 1e6
            for _ in range(args.runs))

    # This machine's own speed drifts (other guests of its host): each neighbour is measured
    # between two runs with nothing beside, and compared with their mean.
    print(f"{len(grammars)} grammars, warm fills, mean per token")
    before = mean_us()
    print(f"{'nothing beside':16s} {before:7.2f} us")
    for name, code in NEIGHBOURS.items():
        child = subprocess.Popen([sys.executable, "-c", code])
        try:
            time.sleep(1.0)
            us = mean_us()
        finally:
            child.kill()
            child.wait()
        after = mean_us()
        print(f"{name:16s} {us:7.2f} us  ({2 * us / (before + after):.2f}x)")
        print(f"{'nothing beside':16s} {after:7.2f} us")
        before = after
    return 0


if __name__ == "__main__":
    sys.exit(main())
