#!/usr/bin/env python3
"""`make test-docs`: what the code tells an operator (every HINT, error, warning and status
text: every string literal in src/ and core/src/) points at docs that exist and says what they
allow.

- every repository path a text names exists (docs/operations/fleet/leave.md, src/...);
- every heading a text names after a page (`docs/x.md, "Heading"`, or `docs/x.md#anchor`)
  is a heading of that page;
- a text that sends the operator to the leaving runbook (docs/operations/fleet/leave.md) and
  quotes one statement of a step of it (its `<!-- runbook: leave step=N -->` blocks) quotes
  every statement of that step: an operator who follows the HINT does the whole step;
- a text that tells to clear tsoracle.oracle names that runbook: cleared alone, the cluster
  refuses every call (`55000`, "the mark of a member" on that page).

Comments are checked for paths and headings too (a developer follows them). Prints what is
wrong and a count; `--self-test` first proves on made-up sources that each check fails."""
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCES = ["src", "core/src", "relay/src"]
PATH = re.compile(r"(?<![\w/.-])((?:src|core|tests|scripts|sql|docs|contrib)/[\w./-]*\w)")
# A page and what follows it: `#anchor`, or `, "Heading"` (a literal's quotes escaped or not).
PAGE = re.compile(r'(docs/[\w./-]*\.md)(?:#([\w-]+)|,\s*\\?"([^"\\]+)\\?")?')
LEAVE = "docs/operations/fleet/leave.md"
CLEAR_ORACLE = re.compile(r"\b(clear|unset|reset|remove|delete)\w*\s+(the\s+)?tsoracle\.oracle\b", re.I)


def slug(heading):
    text = re.sub(r"[`*]", "", heading.strip()).lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def headings(path):
    """A page's headings: their texts (without markup) and their anchors."""
    texts, anchors, seen, in_code = set(), set(), {}, False
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            in_code = not in_code
        # A paragraph's bold label ("- **One run at a time.** …") is named as a heading is.
        label = re.match(r"\s*(?:[-*] |\d+\. )?\*\*([^*]+?)\.?\*\*", line)
        if not in_code and label:
            texts.add(label.group(1).replace("`", ""))
        if in_code or not line.startswith("#"):
            continue
        text = line.lstrip("#").strip()
        texts.add(re.sub(r"[`*]", "", text))
        s = slug(text)
        n = seen.get(s, 0)
        seen[s] = n + 1
        anchors.add(s if n == 0 else f"{s}-{n}")
    return texts, anchors


def rust_texts(source):
    """(line, kind, text) of every string literal ("lit", unescaped) and comment ("comment")."""
    out, i, n, line = [], 0, len(source), 1
    while i < n:
        c = source[i]
        if c == "\n":
            line += 1
            i += 1
        elif source.startswith("//", i):
            end = source.find("\n", i)
            end = n if end < 0 else end
            out.append((line, "comment", source[i:end]))
            i = end
        elif source.startswith("/*", i):
            end = source.find("*/", i)
            end = n if end < 0 else end + 2
            out.append((line, "comment", source[i:end]))
            line += source.count("\n", i, end)
            i = end
        elif re.match(r'(?<![\w])b?r(#*)"', source[i:i + 20]) and (i == 0 or not (source[i - 1].isalnum() or source[i - 1] == "_")):
            m = re.match(r'b?r(#*)"', source[i:])
            close = '"' + m.group(1)
            start = i + m.end()
            end = source.find(close, start)
            end = n if end < 0 else end
            out.append((line, "lit", source[start:end]))
            line += source.count("\n", i, end)
            i = end + len(close)
        elif c == '"':
            j, buf = i + 1, []
            while j < n and source[j] != '"':
                if source[j] == "\\" and j + 1 < n:
                    nxt = source[j + 1]
                    if nxt == "\n":  # a continued line: the break and the next line's indent go
                        j += 2
                        while j < n and source[j] in " \t\n":
                            j += 1
                        continue
                    buf.append({"n": "\n", "t": "\t", '"': '"', "\\": "\\", "'": "'"}.get(nxt, "\\" + nxt))
                    j += 2
                else:
                    buf.append(source[j])
                    j += 1
            out.append((line, "lit", "".join(buf)))
            line += source.count("\n", i, j)
            i = j + 1
        elif c == "'":
            # A char literal ('"', '\'', 'x'), or a lifetime ('a): skip the literal only.
            m = re.match(r"'(\\.|[^\\'])'", source[i:i + 4]) or re.match(r"'\\u\{[0-9a-fA-F]+\}'", source[i:i + 12])
            i += m.end() if m else 1
        else:
            i += 1
    return out


def leave_steps():
    """The statements of each step of the leaving runbook, as psql -c runs them."""
    steps, step = {}, None
    for line in (ROOT / LEAVE).read_text().splitlines():
        m = re.search(r"<!-- runbook: leave step=(\d+) -->", line)
        if m:
            step = int(m.group(1))
            continue
        if step is not None:
            for sql in re.findall(r'-\w*c "([^"]+)"', line):
                if sql.upper().startswith(("DELETE", "UPDATE", "INSERT")):
                    steps.setdefault(step, []).append(sql)
            if line.strip().startswith("```") and steps.get(step):
                step = None
    return steps


def check(files, root=ROOT, steps=None):
    problems, checked = [], 0
    steps = leave_steps() if steps is None else steps
    cache = {}
    for f in files:
        rel = f.relative_to(root)
        for line, kind, text in rust_texts(f.read_text()):
            where = f"{rel}:{line}"
            for m in PATH.finditer(text):
                p = m.group(1).rstrip(".")
                if any(c in p for c in "<>*{}") or p.endswith("/..."):
                    continue
                checked += 1
                if not (root / p).exists():
                    problems.append(f"{where}: names {p}, which does not exist")
            for m in PAGE.finditer(text):
                page, anchor, heading = m.groups()
                if not (anchor or heading) or not (root / page).exists():
                    continue
                checked += 1
                if page not in cache:
                    cache[page] = headings(root / page)
                texts, anchors = cache[page]
                if anchor and anchor not in anchors:
                    problems.append(f"{where}: names {page}#{anchor}, which has no such heading")
                if heading and heading not in texts:
                    problems.append(f'{where}: names {page}, "{heading}", which has no such heading')
            if kind != "lit":
                continue
            leaving = LEAVE in text or "Leaving a fleet" in text or "leave the fleet" in text
            for step, sqls in steps.items():
                quoted = [s for s in sqls if s in text]
                checked += 1
                if leaving and quoted and len(quoted) < len(sqls):
                    missing = "; ".join(s for s in sqls if s not in text)
                    problems.append(f"{where}: quotes step {step} of {LEAVE} without {missing}")
            if CLEAR_ORACLE.search(text):
                checked += 1
                if LEAVE not in text:
                    problems.append(f"{where}: tells to clear tsoracle.oracle without naming {LEAVE}")
    return problems, checked


def self_test():
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        (root / "docs").mkdir()
        (root / "docs/page.md").write_text("# Page\n\n## A heading\n\n- **A label.** text\n")
        src = root / "x.rs"
        src.write_text(
            '// docs/page.md, "A heading", docs/page.md, "A label" and docs/page.md#a-heading: fine\n'
            'const A: &str = "see docs/gone.md";\n'
            'const B: &str = "see (docs/page.md, \\"Moved away\\")";\n'
            "// docs/page.md#moved-away\n"
            'const C: &str = "leave the fleet: DELETE FROM t.a here";\n'
            'const D: &str = "clear tsoracle.oracle on it and restart it";\n'
            "let q = '\"'; // a char literal, not a string\n"
        )
        steps = {3: ["DELETE FROM t.a", "DELETE FROM t.b"]}
        problems, _ = check([src], root, steps)
        want = ["x.rs:2: names docs/gone.md", 'x.rs:3: names docs/page.md, "Moved away"',
                "x.rs:4: names docs/page.md#moved-away", "x.rs:5: quotes step 3", "x.rs:6: tells to clear"]
        for w in want:
            if not any(p.startswith(w) for p in problems):
                sys.exit(f"self-test: expected a problem starting {w!r}, got {problems}")
        if len(problems) != len(want):
            sys.exit(f"self-test: expected {len(want)} problems, got {problems}")
    print("self-test passed: a missing page, heading or anchor, a step quoted in part and a "
          "cleared setting are each found")


if __name__ == "__main__":
    if "--self-test" in sys.argv:
        self_test()
    files = sorted(p for s in SOURCES for p in (ROOT / s).rglob("*.rs"))
    problems, checked = check(files)
    for p in problems:
        print(p)
    print(f"{checked - len(problems)} passed, {len(problems)} failed")
    sys.exit(1 if problems else 0)
