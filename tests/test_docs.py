"""The README and docs/ hold together: every relative link names a file that exists and,
with a `#fragment`, a heading of that file (GitHub's anchor rules); the README stays short."""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README_MAX_LINES = 300

_FENCE = re.compile(r"^\s*(```|~~~)")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
_CODE_SPAN = re.compile(r"(`+)(.+?)\1")
# [text](target "title") or ![alt](target); the text may hold one level of brackets and
# may wrap onto the next line
_INLINE_LINK = re.compile(
    r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)"
)
_REFERENCE_DEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$")
_EXTERNAL = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")  # http:, https:, mailto:, …


def doc_files(root: Path = ROOT) -> list[Path]:
    """README.md and every Markdown page under docs/."""
    return [root / "README.md", *sorted((root / "docs").rglob("*.md"))]


def _prose_lines(text: str) -> list[str]:
    """The lines outside fenced code blocks."""
    lines, fenced = [], False
    for line in text.splitlines():
        if _FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            lines.append(line)
    return lines


def _plain(heading: str) -> str:
    """A heading's text as GitHub renders it: code spans kept as text, markup dropped."""
    text = _CODE_SPAN.sub(lambda m: m.group(2), heading)
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)  # links keep their text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML
    return text.replace("*", "")


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case; letters, digits, spaces, '-' and '_'
    kept (every other character dropped); each space a hyphen."""
    kept = (
        ch
        for ch in _plain(heading).strip().lower()
        if ch in " -_" or unicodedata.category(ch)[0] in "LNM"
    )
    return "".join(kept).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every anchor a page's headings make; a repeated slug gets -1, -2, … as on GitHub."""
    seen: dict[str, int] = {}
    out: set[str] = set()
    for line in _prose_lines(path.read_text(encoding="utf-8")):
        match = _HEADING.match(line)
        if not match:
            continue
        base = slug(match.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        out.add(base if count == 0 else f"{base}-{count}")
    return out


def relative_links(path: Path) -> list[str]:
    """The link targets of a page that point inside the repository (code excluded)."""
    lines = [_CODE_SPAN.sub("", line) for line in _prose_lines(path.read_text(encoding="utf-8"))]
    found = [m.group(1) for m in _INLINE_LINK.finditer("\n".join(lines))]
    found += [m.group(1) for m in map(_REFERENCE_DEF.match, lines) if m]
    return [target for target in found if not _EXTERNAL.match(target)]


def broken_links(path: Path) -> list[str]:
    """Each relative link of `path` whose file or heading does not exist, with the reason."""
    problems = []
    for target in relative_links(path):
        file_part, _, fragment = target.partition("#")
        resolved = (path.parent / file_part).resolve() if file_part else path
        if not resolved.exists():
            problems.append(f"{target}: no such file")
        elif fragment and resolved.suffix == ".md" and fragment not in anchors(resolved):
            problems.append(f"{target}: no heading with anchor #{fragment} in {resolved.name}")
    return problems


@pytest.mark.parametrize("page", doc_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page: Path) -> None:
    assert broken_links(page) == []


def test_readme_stays_short() -> None:
    lines = (ROOT / "README.md").read_text(encoding="utf-8").count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; topics belong in docs/"


def test_github_slugs() -> None:
    assert slug("Engines: `inhouse up --engine`") == "engines-inhouse-up---engine"
    assert slug("Usage reports on 1,000,000 audit rows") == "usage-reports-on-1000000-audit-rows"
    assert slug("Two classes at once: `bench run --mix`") == "two-classes-at-once-bench-run---mix"
    assert slug("Mixed classes: predicted vs measured (issue 27)") == (
        "mixed-classes-predicted-vs-measured-issue-27"
    )


def test_a_broken_link_or_anchor_is_found(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "page.md").write_text("# Page\n\n## A `code` heading\n\ntext\n")
    readme = tmp_path / "README.md"
    readme.write_text(
        "# Title\n\n[ok](docs/page.md#a-code-heading) [self](#title) [web](https://x.invalid/y)\n"
        "[a link whose text\nwraps](docs/page.md#wrapped)\n\n[ref]: docs/gone.md\n"
        "[gone](docs/missing.md) [bad anchor](docs/page.md#nowhere) `[not a link](nope.md)`\n"
        "```\n[in code](nope.md)\n```\n"
    )
    assert broken_links(readme) == [
        "docs/page.md#wrapped: no heading with anchor #wrapped in page.md",
        "docs/missing.md: no such file",
        "docs/page.md#nowhere: no heading with anchor #nowhere in page.md",
        "docs/gone.md: no such file",
    ]


_SOURCE_NAME = re.compile(r"`([\w./]+\.(?:py|cpp|h)|[a-z_]+/)`(?:\s+`(\w+)`)?")


def architecture_names(text: str) -> list[tuple[str, str | None]]:
    """The files (`x.py`, `a/b.cpp`, `pkg/`) docs/architecture.md names, each with the class
    or function named right after it, if any."""
    return [(m.group(1), m.group(2)) for m in _SOURCE_NAME.finditer(text)]


def missing_names(text: str, source: Path) -> list[str]:
    """Each named file that no file under `source` ends with (nor the repository holds at
    that path), and each name after a file that the file does not define or assign."""
    files = [p for p in source.rglob("*") if p.suffix in {".py", ".cpp", ".h"}]
    folders = {p.parent.name for p in files}
    missing = []
    for name, defined in architecture_names(text):
        if name.endswith("/"):
            missing += [] if name.rstrip("/") in folders else [name]
            continue
        found = [p for p in files if p.as_posix().endswith("/" + name)]
        found += [ROOT / name] if (ROOT / name).is_file() else []
        if not found:
            missing.append(name)
        elif defined and not any(
            re.search(rf"^\s*(class|def|async def)\s+{defined}\b|^{defined}\s*[:=]",
                      p.read_text(), re.MULTILINE)
            for p in found
        ):  # fmt: skip
            missing.append(f"{name} {defined}")
    return missing


def test_every_file_and_name_the_architecture_page_gives_exists() -> None:
    text = (ROOT / "docs" / "architecture.md").read_text()
    assert len(architecture_names(text)) > 60  # the page still names its modules
    assert missing_names(text, ROOT / "src" / "inhouse") == []


def test_a_name_the_source_does_not_hold_is_found() -> None:
    wrong = "`scheduler.py` `schedule_all`, `engine/nowhere.py`, `gone/`, `call.py` `Call`"
    assert missing_names(wrong, ROOT / "src" / "inhouse") == [
        "scheduler.py schedule_all", "engine/nowhere.py", "gone/"
    ]  # fmt: skip
