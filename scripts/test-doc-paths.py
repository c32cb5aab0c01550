#!/usr/bin/env python3
"""`make test`: every path of the repository that the manual and the design pages name exists,
and every relative link (and its #anchor) leads somewhere. Prints what is wrong and a count."""
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", ROOT / "BENCHMARKS.md", ROOT / "sql" / "README.md",
        *sorted((ROOT / "docs").rglob("*.md"))]
PATH = re.compile(r"(?<![\w/.-])((?:src|core|tests|scripts|sql|docs|contrib)/[\w./-]*\w)")
LINK = re.compile(r"\]\(([^)\s]+)\)")


def slug(heading):
    text = re.sub(r"[`*]", "", heading.strip()).lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path):
    found, seen = set(), {}
    in_code = False
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            in_code = not in_code
        if in_code or not line.startswith("#"):
            continue
        s = slug(line.lstrip("#"))
        n = seen.get(s, 0)
        seen[s] = n + 1
        found.add(s if n == 0 else f"{s}-{n}")
    return found


problems, checked = [], 0
for doc in DOCS:
    if not doc.exists():
        continue
    text = doc.read_text()
    for m in PATH.finditer(text):
        p = m.group(1).rstrip(".")
        if any(c in p for c in "<>*") or p.endswith("/..."):
            continue
        checked += 1
        if not (ROOT / p).exists():
            problems.append(f"{doc.relative_to(ROOT)}: names {p}, which does not exist")
    for m in LINK.finditer(text):
        target = m.group(1)
        if re.match(r"^[a-z]+:", target):
            continue
        file, _, anchor = target.partition("#")
        dest = (doc.parent / file).resolve() if file else doc
        checked += 1
        if not dest.exists():
            problems.append(f"{doc.relative_to(ROOT)}: links to {target}, which does not exist")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            problems.append(f"{doc.relative_to(ROOT)}: links to {target}, which has no such heading")
for p in problems:
    print(p)
print(f"{checked - len(problems)} passed, {len(problems)} failed")
sys.exit(1 if problems else 0)
