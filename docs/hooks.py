"""MkDocs hooks (mkdocs.yml `hooks:`): the README and the changelog live at the repository's root, where
GitHub shows them, and join the site as its front page (`index.md`) and `changelog.md`: one text each.

Their links are written from the root (`docs/stability.md`, `CHANGELOG.md`); on the site both pages sit
beside the other pages, so exactly that `docs/` prefix is dropped and the README's link to the changelog
points at its page. The pages link to the changelog as `../CHANGELOG.md` (which GitHub resolves); on the
site that link is pointed at the generated page. Nothing else is rewritten.
"""

from __future__ import annotations

import re
from pathlib import Path

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files
from mkdocs.structure.pages import Page

ROOT = Path(__file__).resolve().parent.parent
FROM_ROOT = {"index.md": ROOT / "README.md", "changelog.md": ROOT / "CHANGELOG.md"}
"""Each page made from a file at the root, by its name on the site."""


def on_config(config: MkDocsConfig) -> MkDocsConfig:
    config.watch.extend(str(path) for path in FROM_ROOT.values())  # `mkdocs serve` rebuilds when they change
    return config


def on_files(files: Files, config: MkDocsConfig) -> Files:
    for name, path in FROM_ROOT.items():
        text = re.sub(r"\]\(docs/", "](", path.read_text()).replace("](CHANGELOG.md)", "](changelog.md)")
        files.append(File.generated(config, name, content=text))
    return files


def on_page_markdown(markdown: str, page: Page, config: MkDocsConfig, files: Files) -> str:
    return markdown.replace("](../CHANGELOG.md)", "](changelog.md)")
