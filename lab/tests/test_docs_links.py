"""Relative links in README.md and docs/**/*.md resolve.

Every relative link `[text](path)` or `[text](path#anchor)` must name a file or directory that
exists, and an anchor into a Markdown file must match one of its headings under GitHub's rules
(lowercase; spaces become '-'; punctuation other than '-' and '_' is dropped; a repeated
heading gets '-1', '-2', ...). docs/reports/** is data and is not checked.
"""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# [text](target) or [text](target "title"); images too. Targets without spaces.
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
FENCE = re.compile(r"^\s*(```|~~~)")
INLINE_CODE = re.compile(r"`[^`]*`")


def doc_files():
    files = [ROOT / "README.md"]
    for path in sorted((ROOT / "docs").rglob("*.md")):
        rel = path.relative_to(ROOT / "docs")
        if rel.parts and rel.parts[0] == "reports":
            continue
        files.append(path)
    return files


def prose_lines(text):
    """Lines outside fenced code blocks, with their numbers."""
    fenced = False
    for number, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            yield number, line


def github_anchor(heading):
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link keeps its text
    text = text.strip().lower()
    text = "".join(ch for ch in text if ch.isalnum() or ch in " -_")
    return text.replace(" ", "-")


def anchors(path, cache={}):
    if path not in cache:
        seen = {}
        result = set()
        for _, line in prose_lines(path.read_text(encoding="utf-8")):
            match = HEADING.match(line)
            if not match:
                continue
            anchor = github_anchor(match.group(2))
            count = seen.get(anchor, 0)
            seen[anchor] = count + 1
            result.add(anchor if count == 0 else f"{anchor}-{count}")
        cache[path] = result
    return cache[path]


def links(path):
    """(line number, target) of every link; a link's text may span lines."""
    lines = path.read_text(encoding="utf-8").splitlines()
    kept = [""] * len(lines)
    for number, line in prose_lines("\n".join(lines)):
        kept[number - 1] = INLINE_CODE.sub("", line)
    prose = "\n".join(kept)
    for match in LINK.finditer(prose):
        yield prose.count("\n", 0, match.start(1)) + 1, match.group(1)


def broken_links():
    problems = []
    for path in doc_files():
        for number, target in links(path):
            if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target) or target.startswith("//"):
                continue  # http:, https:, mailto:, ...
            file_part, _, anchor = target.partition("#")
            where = f"{path.relative_to(ROOT)}:{number}: {target}"
            resolved = path if file_part == "" else (path.parent / file_part).resolve()
            if not resolved.exists():
                problems.append(f"{where}: no such file")
                continue
            if anchor and resolved.is_file() and resolved.suffix == ".md":
                if anchor not in anchors(resolved):
                    problems.append(f"{where}: no heading with this anchor")
    return problems


def test_github_anchor_rules():
    assert github_anchor("Link window") == "link-window"
    assert github_anchor("§5.7 with H = 1: one block per relay and cycle (2026-11-27)") == (
        "57-with-h--1-one-block-per-relay-and-cycle-2026-11-27")
    assert github_anchor("Custody persistence hooks (`hop_proto::hop::CustodyStore`)") == (
        "custody-persistence-hooks-hop_protohopcustodystore")


def test_relative_links_in_readme_and_docs_resolve():
    problems = broken_links()
    assert not problems, "broken links:\n" + "\n".join(problems)
