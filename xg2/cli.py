"""The `xg2` command: `xg2 serve` (the Serve application until Ctrl-C), `xg2 demo` (the main job:
the application with its defaults and a multi-tenant scenario through the openai client), and
`xg2 engine-demo` (the library alone over a real vocabulary)."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0
    command, rest = argv[0], argv[1:]
    try:
        if command == "serve":
            from serve.cli import main as run
        elif command == "demo":
            from serve.demo import main as run
        elif command == "engine-demo":
            from .demo import main as run
        else:
            print(f"xg2: unknown command {command!r} (serve, demo, engine-demo)", file=sys.stderr)
            return 2
    except ImportError as e:
        print(f"xg2 {command} needs the serving extras: pip install 'xg2[serve]' ({e})", file=sys.stderr)
        return 2
    return run(rest) or 0


if __name__ == "__main__":
    sys.exit(main())
