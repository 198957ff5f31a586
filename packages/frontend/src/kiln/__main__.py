"""``python -m kiln cache info|clear``: inspect or empty Kiln's on-disk caches."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from kiln import cache
from kiln.loopir.disk_cache import size_limit


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kiln")
    commands = parser.add_subparsers(dest="command", required=True)
    cache_parser = commands.add_parser("cache", help="inspect or empty the on-disk caches")
    cache_parser.add_argument("action", choices=("info", "clear"))
    args = parser.parse_args(argv)
    if args.action == "clear":
        print(f"removed {cache.clear()} entries")
        return 0
    limit_mb = size_limit() / (1024 * 1024)
    for folder in cache.info():
        size_mb = folder.size / (1024 * 1024)
        print(
            f"{folder.name:16} {folder.entries:6} entries {size_mb:9.1f} MB "
            f"(limit {limit_mb:.0f} MB)  {folder.path}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
