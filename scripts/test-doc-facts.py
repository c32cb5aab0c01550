#!/usr/bin/env python3
"""`make test-docs`: the facts the README and docs/ state about the build are the build's.

- every Debian package file they name (`postgresql-15-tsoracle_0.6.0-1_amd64.deb`) has the
  version of Cargo.toml (which tsoracle.control and the SQL scripts take) and the revision
  of scripts/package-deb.sh;
- docs/reference/settings.md has a row for every setting src/pg/guc.rs defines, with its
  default and range;
- a number stated with a setting's name ("`tsoracle.max_members` (64 unless set, up to
  10,000)", "default 64") is that setting's default or its maximum, as the sentence says.

Prints what is wrong and a count; `--self-test` first proves on made-up text that each check
fails."""
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
DEB = re.compile(r"postgresql-(\d+)-tsoracle_([\w.~+]+)-(\w+)_(\w+)\.deb")
NUMBER = r"(\d[\d,_]*)(?:\s*(ms|s)\b)?"
# After a setting's name, in the same parenthesis or clause: what a number is said to be.
DEFAULT = [
    re.compile(NUMBER + r"\s+(?:unless set|by default)"),
    re.compile(r"default(?: is)?\s+`?" + NUMBER),
    # A bare number in a parenthesis right after the name is read as what a cluster gets.
    re.compile(r"^\s*\(" + NUMBER + r"\s*$"),
]
MAXIMUM = [re.compile(r"(?:up to|at most)\s+`?" + NUMBER)]


def number(text, unit=None, setting=""):
    """A number as written (10,000; 100_000), in the setting's unit (`5 s` of a `_ms` one is
    5000)."""
    n = int(text.replace(",", "").replace("_", ""))
    return n * 1000 if unit == "s" and setting.endswith("_ms") else n


def core_consts():
    consts = {}
    for f in (ROOT / "core" / "src").rglob("*.rs"):
        for m in re.finditer(r"pub const (\w+): \w+ = ([\w_]+);", f.read_text()):
            consts[m.group(1)] = m.group(2)
    return consts


def value(expr, consts):
    """A setting's default or bound as guc.rs writes it: a literal, a flag, a string, or a
    constant of the core crate (`tsoracle_core::fleet::MAX_MEMBERS_DEFAULT as i32`)."""
    expr = expr.strip()
    if expr in ("true", "false"):
        return "on" if expr == "true" else "off"
    if expr == "i32::MAX":
        return 2**31 - 1
    if expr == "None":
        return "empty"
    m = re.fullmatch(r'Some\(c"([^"]*)"\)', expr)
    if m:
        return m.group(1)
    m = re.fullmatch(r"(?:tsoracle_core::[\w:]*::)?(\w+)(?: as \w+)?", expr)
    if m and m.group(1) in consts:
        return number(consts[m.group(1)])
    if re.fullmatch(r"-?[\d_]+", expr):
        return number(expr)
    raise ValueError(f"guc.rs: cannot read {expr!r}")


def settings():
    """name -> (default, minimum, maximum) of every setting src/pg/guc.rs defines (but the
    tests' own, behind the clock-fault feature)."""
    text = (ROOT / "src" / "pg" / "guc.rs").read_text()
    consts = core_consts()
    defaults = {}
    for m in re.finditer(r"static (\w+): GucSetting<[^=]*=\s*GucSetting::<[^>]*>+::new\(((?:[^()]|\([^()]*\))*)\);", text):
        defaults[m.group(1)] = value(m.group(2), consts)
    out = {}
    for m in re.finditer(r"(#\[cfg\(feature = \"clock-fault\"\)\]\s*)?GucRegistry::define_(\w+)_guc\(\s*c\"(tsoracle\.\w+)\",(.*?)\);", text, re.S):
        if m.group(1):
            continue
        args = [a.strip() for a in re.split(r",\s*\n", m.group(4)) if a.strip()]
        static = next(a[1:] for a in args if a.startswith("&"))
        low = high = None
        if m.group(2) == "int":
            at = next(i for i, a in enumerate(args) if a.startswith("&"))
            low, high = value(args[at + 1].rstrip(","), consts), value(args[at + 2].rstrip(","), consts)
        out[m.group(3)] = (defaults[static], low, high)
    return out


def check(docs, known, version, revision, settings_page):
    problems, checked = [], 0
    for doc in docs:
        text = doc.read_text()
        name = str(doc.relative_to(ROOT)) if doc.is_relative_to(ROOT) else doc.name
        for m in DEB.finditer(text):
            checked += 1
            if (m.group(2), m.group(3)) != (version, revision):
                problems.append(f"{name}: names {m.group(0)}, but the build makes version {version}-{revision}")
        for m in re.finditer(r"`(tsoracle\.\w+)`", text):
            if m.group(1) not in known:
                continue
            default, _, high = known[m.group(1)]
            # The rest of the clause: up to the parenthesis, sentence or row that ends it.
            rest = re.split(r"\)|\.\s|\.$|\||\n\n|`tsoracle\.", text[m.end():m.end() + 160])[0]
            for patterns, want, what in ((DEFAULT, default, "default"), (MAXIMUM, high, "maximum")):
                for p in patterns:
                    for n in p.finditer(rest):
                        checked += 1
                        if want is None or number(n.group(1), n.group(2), m.group(1)) != want:
                            problems.append(f"{name}: says {m.group(1)} {n.group(0)!r}, but its {what} is {want}")
    rows = {}
    for line in settings_page.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 4 or not cells[0].startswith("`tsoracle."):
            continue
        names = [n if n.startswith("tsoracle.") else "tsoracle" + n for n in re.findall(r"`([\w.]+)`", cells[0])]
        defaults = [d.strip().strip("`") for d in cells[1].split(",")]
        for i, n in enumerate(names):
            rows[n] = (defaults[i] if i < len(defaults) else defaults[-1], cells[2])
    for n, (default, low, high) in sorted(known.items()):
        checked += 1
        if n not in rows:
            problems.append(f"{settings_page.name}: no row for {n}")
            continue
        shown, range_ = rows[n]
        if str(default) != shown:
            problems.append(f"{settings_page.name}: {n}'s default is {shown}, the build's {default}")
        if low is not None:
            bounds = [number(b) for b in re.findall(r"\d[\d,_]*", range_)]
            if bounds != [low, high]:
                problems.append(f"{settings_page.name}: {n}'s range is {range_}, the build's {low} – {high}")
    return problems, checked


def self_test():
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        readme = Path(d) / "README.md"
        readme.write_text(
            "dpkg -i postgresql-15-tsoracle_0.5.0-1_amd64.deb\n"
            "up to `tsoracle.max_members` (10,000) per oracle.\n"
            "`tsoracle.max_members` (64 unless set, up to 10,000): fine.\n"
        )
        page = Path(d) / "settings.md"
        page.write_text("| `tsoracle.max_members` | `64` | 1 – 1000 | restart | x |\n")
        known = {"tsoracle.max_members": (64, 1, 10000), "tsoracle.x": (1, 0, 5)}
        problems, _ = check([readme], known, "0.6.0", "1", page)
        want = ["README.md: names postgresql-15-tsoracle_0.5.0-1_amd64.deb",
                "README.md: says tsoracle.max_members ' (10,000'",
                "settings.md: tsoracle.max_members's range", "settings.md: no row for tsoracle.x"]
        for w in want:
            if not any(p.startswith(w) for p in problems):
                sys.exit(f"self-test: expected a problem starting {w!r}, got {problems}")
        if len(problems) != len(want):
            sys.exit(f"self-test: expected {len(want)} problems, got {problems}")
    print("self-test passed: a package of another version, a wrong default, a wrong range and a "
          "missing row are each found")


if __name__ == "__main__":
    if "--self-test" in sys.argv:
        self_test()
    version = re.search(r'^version = "([^"]+)"', (ROOT / "Cargo.toml").read_text(), re.M).group(1)
    revision = re.search(r"^REVISION=(\w+)", (ROOT / "scripts" / "package-deb.sh").read_text(), re.M).group(1)
    control = (ROOT / "tsoracle.control").read_text()
    problems, checked = check(DOCS, settings(), version, revision, ROOT / "docs" / "reference" / "settings.md")
    checked += 1
    if "default_version = '@CARGO_VERSION@'" not in control and f"default_version = '{version}'" not in control:
        problems.append(f"tsoracle.control: default_version is not Cargo.toml's {version}")
    for p in problems:
        print(p)
    print(f"{checked - len(problems)} passed, {len(problems)} failed")
    sys.exit(1 if problems else 0)
