"""README.md's documentation list names every page of docs/ (the site's home, index.md,
apart), so a new page is found from the repository's front page too."""

from __future__ import annotations

import re

from support.docblocks import REPO


def test_the_readme_lists_every_page() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index("\n## Documentation\n") :]
    section = section[: section.find("\n## ", 1)]
    listed = set(re.findall(r"\]\((docs/[\w.-]+\.md)\)", section))
    pages = {f"docs/{p.name}" for p in (REPO / "docs").glob("*.md")} - {"docs/index.md"}
    assert not pages - listed, (
        f"pages missing from README.md's Documentation list: {sorted(pages - listed)}"
    )
    assert not listed - pages, f"README.md lists pages that do not exist: {sorted(listed - pages)}"
    assert {"docs/ray.md", "docs/mixtures.md", "docs/notebook.md"} <= listed
