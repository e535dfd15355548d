"""The README is a newcomer's page and the docs hang together: docs/index.md links every page,
docs/performance.md is a user's page (the lab notes are benchmarks/NOTES.md),
every relative link (and its #anchor) resolves to a file of the repository, nothing links
outside it (no absolute paths, no ``..`` out of the repository; the README links nowhere but
the repository), and the README stays short with its set-up commands and first use on top."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
README = ROOT / "README.md"
NOTES = ROOT / "benchmarks" / "NOTES.md"
PAGES = [README, *sorted(DOCS.glob("*.md")), NOTES]

SETUP = (
    'pip install torch==2.13.0 ".[lab]" && jupyter lab notebooks/01-quickstart.ipynb',
    'pip install torch==2.13.0 -e ".[dev]" && bash scripts/test',
)
README_MAX_LINES = 200
PERFORMANCE_MAX_LINES = 400
FIRST_USE_BY_LINE = 40

_FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)
_CODE = re.compile(r"`[^`\n]*`")
_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def links(path: Path) -> list[str]:
    """The targets of the Markdown links of ``path``, code left out."""
    text = _CODE.sub("", _FENCE.sub("", path.read_text(encoding="utf-8")))
    return _LINK.findall(text)


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = _CODE.sub(lambda m: m.group(0)[1:-1], heading.strip()).lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = _FENCE.sub("", path.read_text(encoding="utf-8"))
    found: set[str] = set()
    for heading in re.findall(r"^#{1,6} (.+)$", text, re.M):
        base = slug(heading)
        name, n = base, 0
        while name in found:
            n += 1
            name = f"{base}-{n}"
        found.add(name)
    return found


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_link_resolves_inside_the_repository(page: Path) -> None:
    for target in links(page):
        if target.startswith(("http://", "https://")):
            assert page != README, f"README.md links outside the repository: {target}"
            continue
        assert not target.startswith(("/", "file:", "~")), f"{page.name}: absolute link {target}"
        assert "shared/" not in target, f"{page.name}: links outside the repository: {target}"
        file, _, anchor = target.partition("#")
        resolved = (page.parent / file).resolve() if file else page
        assert resolved.is_relative_to(ROOT), f"{page.name}: {target} leaves the repository"
        assert resolved.exists(), f"{page.name}: {target} does not exist"
        if anchor and resolved.suffix == ".md":
            assert anchor in anchors(resolved), f"{page.name}: no heading #{anchor} in {file}"


def test_no_page_points_at_files_outside_the_repository() -> None:
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        assert "../shared" not in text and "DESIGN.md" not in text, page.name


def test_the_index_links_every_page() -> None:
    index = DOCS / "index.md"
    linked = {(DOCS / target.partition("#")[0]).resolve() for target in links(index)}
    for page in sorted(DOCS.iterdir()):
        if page.suffix in (".md", ".json") and page != index:
            assert page.resolve() in linked, f"docs/index.md does not link {page.name}"
    assert README.resolve() in linked


def test_the_readme_is_a_newcomers_page() -> None:
    text = README.read_text(encoding="utf-8")
    lines = text.splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines"
    first_use = next(i for i, line in enumerate(lines) if "nbmonitor.attach(" in line)
    assert first_use < FIRST_USE_BY_LINE
    # The two set-up commands, first thing under "Set up", before the loop's example.
    setup = lines.index("## Set up")
    use = lines.index("## Use")
    commands = [text.index(f"```bash\n{command}\n```") for command in SETUP]
    offsets = [len("\n".join(lines[:n])) for n in (setup, use)]
    assert offsets[0] < commands[0] < commands[1] < offsets[1]
    assert "(docs/dashboard.png)" in text and (DOCS / "dashboard.png").is_file()
    for page in ("docs/getting-started.md", "docs/guide.md", "docs/api.md", "docs/index.md"):
        assert f"]({page})" in text, page


def test_performance_is_a_users_page_and_the_lab_notes_are_under_benchmarks() -> None:
    page = DOCS / "performance.md"
    lines = page.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= PERFORMANCE_MAX_LINES, f"docs/performance.md has {len(lines)} lines"
    assert "../benchmarks/NOTES.md" in links(page)
    assert {"## What attaching costs", "## Measure it on your own loop"} <= set(lines)


def test_the_link_checker_catches_a_broken_link(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "[a](missing.md) `[not](a-link.md)`\n```\n[nor](this.md)\n```\n[b](#the-heading)\n"
        "## The heading\n"
    )
    assert links(page) == ["missing.md", "#the-heading"]
    assert "the-heading" in anchors(page)
    assert slug("`nbmonitor.attach`") == "nbmonitorattach"
    assert slug("Use with ...") == "use-with-"
