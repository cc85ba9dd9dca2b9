"""The documentation's relative links lead somewhere: every link in README.md, docs/*.md and docs/decisions/*.md
names a file of the repository, and a `#fragment` names a heading of its target. Pure Python, no build needed."""

from __future__ import annotations

import glob
import os
import re
import sys
from typing import Iterator, List, Tuple

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGES = [os.path.join(REPO, "README.md")] + sorted(
    glob.glob(os.path.join(REPO, "docs", "*.md")) + glob.glob(os.path.join(REPO, "docs", "decisions", "*.md"))
)

# docs/knobs.md, the table of every knob, is generated (python -m hvdlite.runner.knobs_doc); links to it are left to
# test_the_knob_reference_exists instead of failing once per link.
KNOBS_PAGE = os.path.join(REPO, "docs", "knobs.md")

_FENCE = re.compile(r"^\s*(```|~~~)")
_INLINE_CODE = re.compile(r"`+[^`]*`+")
# [text](target) and ![alt](target); the target may carry a "title" after a space.
_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_REFERENCE = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$")
_HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
_HTML_ANCHOR = re.compile(r"<a\s+(?:name|id)=\"([^\"]+)\"")


def _prose_lines(path: str) -> Iterator[Tuple[int, str]]:
    """(line number, line) outside fenced code blocks."""
    in_fence = False
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if _FENCE.match(line):
                in_fence = not in_fence
                continue
            if not in_fence:
                yield number, line


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped (hyphens and underscores kept), spaces to
    hyphens. Markdown link syntax in the heading counts by its text."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = re.sub(r"<[^>]+>", "", text).lower()
    text = "".join(ch for ch in text if ch.isalnum() or ch in "-_ ")
    return text.replace(" ", "-")


def anchors(path: str) -> set:
    """Every anchor a link can name in ``path``: its headings (repeats get -1, -2, ... as on GitHub) and explicit
    <a name/id> tags."""
    found: set = set()
    seen: dict = {}
    for _, line in _prose_lines(path):
        found.update(_HTML_ANCHOR.findall(line))
        match = _HEADING.match(line)
        if not match:
            continue
        slug = _slug(match.group(2))
        if slug in seen:
            seen[slug] += 1
            slug = "%s-%d" % (slug, seen[slug])
        else:
            seen[slug] = 0
        found.add(slug)
    return found


def links(path: str) -> List[Tuple[int, str]]:
    """(line, target) of every link in ``path``'s prose (not in code blocks or code spans)."""
    found = []
    for number, line in _prose_lines(path):
        prose = _INLINE_CODE.sub("", line)
        found += [(number, target) for target in _LINK.findall(prose)]
        reference = _REFERENCE.match(prose)
        if reference:
            found.append((number, reference.group(1)))
    return found


def _is_external(target: str) -> bool:
    return bool(re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I))  # http:, https:, mailto:, ...


def _problems(path: str) -> List[str]:
    problems = []
    name = os.path.relpath(path, REPO)
    for number, target in links(path):
        if _is_external(target):
            continue
        file_part, _, fragment = target.partition("#")
        resolved = os.path.normpath(os.path.join(os.path.dirname(path), file_part)) if file_part else path
        where = "%s:%d: %s" % (name, number, target)
        if resolved == KNOBS_PAGE and not os.path.exists(KNOBS_PAGE):
            continue  # test_the_knob_reference_exists reports it, once
        if not resolved.startswith(REPO + os.sep) and resolved != REPO:
            problems.append(where + " (leaves the repository)")
        elif not os.path.exists(resolved):
            problems.append(where + " (no such file)")
        elif fragment and resolved.endswith(".md") and fragment not in anchors(resolved):
            problems.append(where + " (no heading #%s in %s)" % (fragment, os.path.relpath(resolved, REPO)))
    return problems


@pytest.mark.parametrize("path", PAGES, ids=[os.path.relpath(p, REPO) for p in PAGES])
def test_every_relative_link_resolves(path):
    assert _problems(path) == []


def test_the_knob_reference_exists():
    # Expected, not optional: README.md and docs/ link to docs/knobs.md, the generated table of every knob
    # (another engineer's change adds it). This fails until that file is in the tree.
    linked_from = [
        os.path.relpath(p, REPO)
        for p in PAGES
        if any(
            os.path.normpath(os.path.join(os.path.dirname(p), t.partition("#")[0])) == KNOBS_PAGE
            for _, t in links(p)
            if not _is_external(t) and t.partition("#")[0]
        )
    ]
    assert linked_from, "nothing links to docs/knobs.md any more: drop this test"
    assert os.path.exists(KNOBS_PAGE), "docs/knobs.md is linked from %s but does not exist yet" % ", ".join(
        linked_from
    )


def test_the_checker_sees_links_anchors_and_code(tmp_path):
    # The helpers themselves, on a page made here: a link in a code block or span is no link, and the slug rule
    # matches GitHub's for headings with code, punctuation and repeats.
    page = tmp_path / "page.md"
    page.write_text(
        "# A `code` title: (x)\n\n## Again\n\n## Again\n\n[ok](#a-code-title-x) [two](#again-1)\n"
        "`[not](nowhere.md)`\n\n```\n[not](nowhere.md)\n```\n[ref]: other.md#top\n"
    )
    assert links(str(page)) == [(7, "#a-code-title-x"), (7, "#again-1"), (13, "other.md#top")]
    assert {"a-code-title-x", "again", "again-1"} <= anchors(str(page))


def test_the_benchmarks_page_is_what_its_template_and_results_give():
    """docs/benchmarks.md is generated from docs/benchmarks.md.in and bench/results/*.json, each table drawn by its
    benchmark's render function: an edit of the page alone, a result without its table, or a renderer that no
    longer reads its kept results fails here."""
    sys.path.insert(0, os.path.join(REPO, "bench"))
    import page

    with open(page.TEMPLATE) as f:
        expected = page.generate(f.read())
    with open(page.PAGE) as f:
        assert f.read() == expected, "docs/benchmarks.md differs from what python bench/page.py writes"


def test_docs_are_references_not_journals():
    """One dated table per benchmark, history left to git: docs/*.md together hold at most 15 dates."""
    dates = []
    for path in glob.glob(os.path.join(REPO, "docs", "*.md")):
        with open(path, encoding="utf-8") as f:
            dates += [(os.path.basename(path), d) for d in re.findall(r"20\d\d-[01]\d-[0-3]\d", f.read())]
    assert len(dates) <= 15, dates
