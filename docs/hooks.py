"""MkDocs hooks (mkdocs.yml `hooks:`): the changelog lives at the repository's root, where GitHub and
Keep a Changelog readers look for it, and joins the site as `changelog.md`.

Its links are written from the root (`docs/stability.md`); on the site the page sits beside the other pages,
so exactly that `docs/` prefix is dropped. The pages link to it as `../CHANGELOG.md` (which GitHub
resolves); on the site that link is pointed at the generated page. Nothing else is rewritten.
"""

from __future__ import annotations

import re
from pathlib import Path

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files
from mkdocs.structure.pages import Page

CHANGELOG = Path(__file__).resolve().parent.parent / "CHANGELOG.md"


def on_config(config: MkDocsConfig) -> MkDocsConfig:
    config.watch.append(str(CHANGELOG))  # `mkdocs serve` rebuilds when it changes
    return config


def on_files(files: Files, config: MkDocsConfig) -> Files:
    text = re.sub(r"\]\(docs/", "](", CHANGELOG.read_text())
    files.append(File.generated(config, "changelog.md", content=text))
    return files


def on_page_markdown(markdown: str, page: Page, config: MkDocsConfig, files: Files) -> str:
    return markdown.replace("](../CHANGELOG.md)", "](changelog.md)")
