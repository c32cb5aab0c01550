#!/usr/bin/env python3
"""The extension's layers (src/lib.rs): dependencies point one way, and no module imports in a
circle.

    sql -> caller -> shmem <- worker, with pg (PostgreSQL glue) under all of them

Every `use` and every `crate::` / `super::` / `self::` path in src/ is resolved to the module
file it names (the longest prefix that is a module); that gives one edge per pair of files. The
check fails, naming the files, on:

- an edge between layers that the picture does not allow (pg may use no other layer, shmem only
  pg, caller shmem and pg, worker shmem and pg, sql everything but worker);
- a circle of modules, within a layer or across layers (a module and its parent included:
  `super::X` for an X defined in the parent's mod.rs is an edge to the parent).

`mod x;` declarations are containment, not edges. Usage:

    scripts/check-layers.py [SRC_DIR]     # default: src/ beside this script's parent
    scripts/check-layers.py --self-test   # the check finds a circle and a layer violation
"""

import os
import re
import sys
import tempfile

LAYERS = {
    "pg": set(),
    "shmem": {"pg"},
    "caller": {"shmem", "pg"},
    "worker": {"shmem", "pg"},
    "sql": {"caller", "shmem", "pg"},
}

IDENT = r"[A-Za-z_][A-Za-z0-9_]*"


def strip_comments_and_strings(text):
    """Source without comments, string and char literals (so that paths in prose or SQL do not count)."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            depth, i = 1, i + 2
            while i < n and depth:
                if text.startswith("/*", i):
                    depth, i = depth + 1, i + 2
                elif text.startswith("*/", i):
                    depth, i = depth - 1, i + 2
                else:
                    i += 1
        elif c == "r" and re.match(r'r#*"', text[i:i + 10]) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            m = re.match(r'r(#*)"', text[i:])
            end = '"' + m.group(1)
            j = text.find(end, i + len(m.group(0)))
            i = n if j < 0 else j + len(end)
            out.append('""')
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            i = j + 1
            out.append('""')
        elif c == "'" and re.match(r"'(\\.|[^\\'])'", text[i:i + 4]):
            m = re.match(r"'(\\.|[^\\'])'", text[i:])
            i += len(m.group(0))
            out.append("' '")
        else:
            out.append(c)
            i += 1
    return "".join(out)


def expand_use_tree(tree):
    """`a::{b, c::{d, e}}` -> ['a::b', 'a::c::d', 'a::c::e'] (aliases and globs dropped)."""
    tree = re.sub(r"\s+", "", tree)
    results = []

    def walk(prefix, t):
        # split top-level on commas
        depth, start, parts = 0, 0, []
        for k, ch in enumerate(t):
            if ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
            elif ch == "," and depth == 0:
                parts.append(t[start:k])
                start = k + 1
        parts.append(t[start:])
        for p in parts:
            if not p:
                continue
            if "{" in p:
                head, rest = p.split("{", 1)
                walk(prefix + head, rest[: rest.rfind("}")])
            else:
                p = re.sub(r"as" + IDENT + "$", "", p) if "as" in p and re.search(r"[a-z0-9_]as[A-Za-z_]", p) else p
                results.append(prefix + p)

    walk("", tree)
    return results


def module_of(src, path):
    rel = os.path.relpath(path, src)[:-3].split(os.sep)
    if rel == ["lib"]:
        return ()
    if rel[-1] == "mod":
        rel = rel[:-1]
    return tuple(rel)


def references(text, children):
    """Every path the file names, as strings starting with crate::, super:: or self:: (a path
    that starts with the name of one of the file's child modules is made `self::` relative)."""
    code = strip_comments_and_strings(text)
    paths = []
    for m in re.finditer(r"\buse\s+([^;]+);", code):
        for p in expand_use_tree(m.group(1)):
            paths.append(p)
    for m in re.finditer(r"(?<![A-Za-z0-9_:])((?:crate|super|self)(?:::" + IDENT + ")+)", code):
        paths.append(m.group(1))
    for child in children:
        for m in re.finditer(r"(?<![A-Za-z0-9_:])(" + re.escape(child) + r"(?:::" + IDENT + ")+)", code):
            paths.append(m.group(1))
    out = []
    for p in paths:
        if re.match(r"(crate|super|self)::", p):
            out.append(p)
        elif p.split("::")[0] in children:
            out.append("self::" + p)
    return out


def resolve(current, path, modules):
    """The module (tuple) a path names, seen from module `current`, or None if outside the crate."""
    segs = path.split("::")
    if segs[0] == "crate":
        base, rest = [], segs[1:]
    else:
        base = list(current)
        rest = segs
        while rest and rest[0] in ("super", "self"):
            if rest[0] == "super":
                if not base:
                    return None
                base.pop()
            rest = rest[1:]
    full = base + rest
    for k in range(len(full), -1, -1):
        if tuple(full[:k]) in modules:
            return tuple(full[:k])
    return None


def layer(module):
    return module[0] if module else None


def show(module):
    return "crate" if not module else "crate::" + "::".join(module)


def check(src):
    files = {}
    for root, _, names in os.walk(src):
        for name in names:
            if name.endswith(".rs"):
                path = os.path.join(root, name)
                files[module_of(src, path)] = path
    modules = set(files)
    edges = {m: set() for m in modules}
    problems = []
    for m, path in sorted(files.items()):
        with open(path, encoding="utf-8") as f:
            text = f.read()
        children = {c[-1] for c in modules if len(c) == len(m) + 1 and c[: len(m)] == m}
        for p in references(text, children):
            target = resolve(m, p, modules)
            if target is None or target == m:
                continue
            # A file naming its own descendant through a path is containment only when it is
            # the `mod` declaration, which `references` does not see; anything else is an edge.
            edges[m].add(target)
            lm, lt = layer(m), layer(target)
            if lm is None or lt is None or lm == lt:
                continue
            if lm in LAYERS and lt not in LAYERS[lm]:
                problems.append(
                    f"layer violation: {show(m)} ({lm}) uses {show(target)} ({lt}) through `{p}`; "
                    f"{lm} may use only {', '.join(sorted(LAYERS[lm])) or 'no other layer'}"
                )
    # Circles: Tarjan's strongly connected components.
    index, low, on_stack, stack, sccs = {}, {}, set(), [], []
    counter = [0]

    def strong(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                sccs.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(modules):
        if v not in index:
            strong(v)
    for comp in sccs:
        problems.append("import circle: " + " <-> ".join(show(c) for c in comp))
    problems = list(dict.fromkeys(problems))
    return problems, sum(len(e) for e in edges.values()), len(modules)


def self_test():
    cases = {
        "circle": {
            "lib.rs": "mod pg;\n",
            "pg/mod.rs": "pub mod a;\npub mod b;\n",
            "pg/a.rs": "use super::b::B;\npub struct A;\n",
            "pg/b.rs": "use crate::pg::a::A; // a circle\npub struct B;\n",
        },
        "parent": {
            "lib.rs": "mod worker;\n",
            "worker/mod.rs": "mod fence;\nuse fence::f;\npub struct Worker;\n",
            "worker/fence.rs": "use super::Worker;\npub fn f() {}\n",
        },
        "layer": {
            "lib.rs": "mod pg;\nmod shmem;\n",
            "pg/mod.rs": "pub fn f() { crate::shmem::g() }\n",
            "shmem/mod.rs": "pub fn g() {}\n",
        },
        "clean": {
            "lib.rs": "mod pg;\nmod shmem;\nmod worker;\n",
            "pg/mod.rs": "pub fn f() {}\n// crate::shmem::g in a comment\n",
            "shmem/mod.rs": "use crate::pg::f;\npub fn g() { f(); let _ = \"crate::worker::x\"; }\n",
            "worker/mod.rs": "mod a;\nmod b;\n",
            "worker/a.rs": "use super::b::{B, C as D};\nuse crate::{pg, shmem::g};\n",
            "worker/b.rs": "pub struct B; pub struct C;\n",
        },
    }
    expected = {"circle": "import circle", "parent": "import circle", "layer": "layer violation", "clean": None}
    ok = True
    for name, tree in cases.items():
        with tempfile.TemporaryDirectory() as d:
            for rel, text in tree.items():
                path = os.path.join(d, rel)
                os.makedirs(os.path.dirname(path), exist_ok=True)
                with open(path, "w", encoding="utf-8") as f:
                    f.write(text)
            problems, _, _ = check(d)
            want = expected[name]
            found = any(want in p for p in problems) if want else not problems
            print(f"self-test {name}: {'ok' if found else 'FAILED'} {problems}")
            ok &= found
    return ok


def main():
    if sys.argv[1:] == ["--self-test"]:
        sys.exit(0 if self_test() else 1)
    src = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src")
    problems, n_edges, n_modules = check(src)
    for p in problems:
        print(p)
    if problems:
        print(f"check-layers: {len(problems)} problem(s) in {src}")
        sys.exit(1)
    print(f"check-layers: {n_modules} modules, {n_edges} edges, no circle, every edge points down its layers")


if __name__ == "__main__":
    main()
