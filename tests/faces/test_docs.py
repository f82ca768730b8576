"""The docs site follows the code: the API reference covers ``__all__``, the README's links hold.

``make docs`` (``mkdocs build --strict``) checks the pages' own links and anchors; it never
reads the README, which is the landing page on the repository, so its links are checked here.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pyrula_stream

ROOT = Path(__file__).resolve().parents[2]
DIRECTIVE = re.compile(r"^::: pyrula_stream\.(\w+)\s*$", re.MULTILINE)
LINK = re.compile(r"\]\(([^)\s]+)\)")


def test_the_api_reference_documents_each_exported_name_once() -> None:
    pages = sorted((ROOT / "docs" / "reference").glob("*.md"))
    documented = Counter(
        name for page in pages for name in DIRECTIVE.findall(page.read_text(encoding="utf-8"))
    )
    exported = set(pyrula_stream.__all__)
    assert sorted(exported - set(documented)) == []  # exported, not in the reference
    assert sorted(set(documented) - exported) == []  # in the reference, not exported
    assert [name for name, n in documented.items() if n > 1] == []


def test_the_readme_is_a_landing_page_whose_links_resolve() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 150
    for command in ("make demo", "make test"):
        assert f"\n{command} " in readme, command
    targets = [t for t in LINK.findall(readme) if "://" not in t]
    assert targets, "the README links to the docs pages"
    for target in targets:
        path, _, anchor = target.partition("#")
        assert (ROOT / path).is_file(), target
        if anchor:
            headings = (ROOT / path).read_text(encoding="utf-8")
            slugs = {slug(h) for h in re.findall(r"^#+ (.+)$", headings, re.MULTILINE)}
            assert anchor in slugs, target


def slug(heading: str) -> str:
    """The anchor Python-Markdown's toc gives a heading (ASCII headings, as ours are)."""
    text = re.sub(r"[^\w\s-]", "", heading.replace("`", "")).strip().lower()
    return re.sub(r"[-\s]+", "-", text)
