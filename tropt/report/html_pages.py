"""What a shared report.html needs beyond nbconvert's page: no notebook instructions (they are for someone editing
the notebook, not reading its result), wide tables that scroll instead of being cut, and "what this means" pages
that still open once the file is mailed: the pages are embedded at the end of the report and the links point at
them, unless ``TROPT_DOCS_URL`` names a stable site (then the links go there and nothing is embedded)."""

from __future__ import annotations

import html
import re
from typing import Any

INSTRUCTIONS_TAG = "instructions"  # markdown cells that tell a notebook user what to fill in: not in the report
DOC_ANCHOR = "tropt-doc-"
_FILE_LINK = re.compile(r'href="file://[^"]*/docs/checks/([A-Za-z0-9_.]+)\.md"(?: target="_blank")?')

SCROLL_CSS = ("<style>.jp-OutputArea-child,.jp-OutputArea-output,.jp-RenderedHTMLCommon{min-width:0;max-width:100%}"
              ".jp-OutputArea-output{overflow-x:auto}.tropt-evidence{max-width:100%;overflow-x:auto}"
              ".tropt-docs{border-top:1px solid #d0d7de;margin-top:2em}</style>")


def drop_instructions(nb: Any) -> None:
    """Remove the cells tagged ``instructions`` (in place)."""
    nb.cells = [c for c in nb.cells if INSTRUCTIONS_TAG not in c.get("metadata", {}).get("tags", [])]


def _html_outputs(nb: Any):
    for cell in nb.cells:
        for out in cell.get("outputs", []) if cell.get("cell_type") == "code" else []:
            data = out.get("data", {})
            if "text/html" in data:
                yield data


def embed_doc_pages(nb: Any) -> list[str]:
    """Point every ``file://`` "what this means" link at a copy of its page appended to ``nb`` (in place); returns
    the check ids embedded. Links to a configured docs site (http...) are left as they are."""
    from nbformat.v4 import new_code_cell, new_output

    from ..checkdocs import check_doc_path

    ids: list[str] = []
    for data in _html_outputs(nb):
        text = data["text/html"] if isinstance(data["text/html"], str) else "".join(data["text/html"])
        for cid in _FILE_LINK.findall(text):
            if cid not in ids:
                ids.append(cid)
        data["text/html"] = _FILE_LINK.sub(lambda m: f'href="#{DOC_ANCHOR}{m.group(1)}"', text)
    # One HTML output, each page collapsed like the evidence (the report opens on its findings). Markdown cells
    # cannot hold a page inside <details>: the renderer closes the block at the page's first blank line.
    import mistune  # nbconvert's own markdown renderer, present wherever a report is built

    pages = []
    for cid in ids:
        path = check_doc_path(cid)
        if path.is_file():
            pages.append(f'<details id="{DOC_ANCHOR}{html.escape(cid)}"><summary>{html.escape(cid)}</summary>'
                         f'{mistune.html(path.read_text(encoding="utf-8"))}</details>')
    if pages:
        head = ('<div class="tropt-docs"><h2>What the checks mean</h2><p>The pages the "what this means" links open, '
                "as shipped with this version of tropt.</p>")
        nb.cells.append(new_code_cell("", outputs=[new_output("display_data",
                                                              data={"text/html": head + "".join(pages) + "</div>"})]))
    return ids
