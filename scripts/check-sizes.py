#!/usr/bin/env python3
"""Size limits of the repository's documents and sources.

- README.md at most 15,000 bytes, BENCHMARKS.md at most 20,000 bytes, and every page under
  docs/ (docs/**/*.md) at most 20,000 bytes;
- every .rs file under src/ and tests/ at most 1,000 lines (split a file by concern before it
  grows past that: see tests/src/node/, tests/src/history/, tests/src/load/).

Fails (exit 1) naming every file over its limit (or missing); otherwise prints a one-line
summary. Usage:

    scripts/check-sizes.py [ROOT]     # default: the repository this script is in
"""

import os
import sys

MAX_BYTES = {"README.md": 15_000, "BENCHMARKS.md": 20_000}
MAX_DOC_BYTES = 20_000
DOC_DIR = "docs"
MAX_RS_LINES = 1_000
RS_DIRS = ("src", "tests")


def line_count(path):
    with open(path, "rb") as f:
        return len(f.read().splitlines())


def rs_files(root):
    for d in RS_DIRS:
        top = os.path.join(root, d)
        for dirpath, dirnames, filenames in os.walk(top):
            dirnames[:] = sorted(n for n in dirnames if n != "target" and not n.startswith("."))
            for name in sorted(filenames):
                if name.endswith(".rs"):
                    yield os.path.join(dirpath, name)


def main(argv):
    root = argv[1] if len(argv) > 1 else os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    problems = []
    sizes = []
    for name, limit in MAX_BYTES.items():
        path = os.path.join(root, name)
        if not os.path.isfile(path):
            problems.append(f"{name}: missing")
            continue
        size = os.path.getsize(path)
        sizes.append(f"{name} {size:,}/{limit:,} bytes")
        if size > limit:
            problems.append(f"{name}: {size:,} bytes, over the limit of {limit:,}")
    docs, largest, largest_path = 0, 0, None
    for dirpath, dirnames, filenames in os.walk(os.path.join(root, DOC_DIR)):
        dirnames.sort()
        for name in sorted(filenames):
            if not name.endswith(".md"):
                continue
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, root)
            size = os.path.getsize(path)
            docs += 1
            if size > largest:
                largest, largest_path = size, rel
            if size > MAX_DOC_BYTES:
                problems.append(f"{rel}: {size:,} bytes, over the limit of {MAX_DOC_BYTES:,}")
    if docs == 0:
        problems.append(f"{DOC_DIR}/: no .md page found")
    sizes.append(f"{docs} pages under {DOC_DIR}/ at most {MAX_DOC_BYTES:,} bytes (largest {largest_path}, {largest:,})")
    count, longest, longest_path = 0, 0, None
    for path in rs_files(root):
        count += 1
        n = line_count(path)
        rel = os.path.relpath(path, root)
        if n > longest:
            longest, longest_path = n, rel
        if n > MAX_RS_LINES:
            problems.append(f"{rel}: {n:,} lines, over the limit of {MAX_RS_LINES:,}")
    if problems:
        for p in problems:
            print(f"check-sizes: {p}", file=sys.stderr)
        return 1
    print(
        f"check-sizes: ok: {', '.join(sizes)}; {count} .rs files under "
        f"{' and '.join(d + '/' for d in RS_DIRS)} at most {MAX_RS_LINES:,} lines "
        f"(longest {longest_path}, {longest:,})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
