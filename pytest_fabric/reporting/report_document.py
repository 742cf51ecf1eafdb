"""The report's document: built once as a list of blocks (headings, paragraphs, bullets, tables,
images) and rendered twice, Markdown and self-contained HTML (inline CSS), so the two never
disagree; written with secrets masked. ``htmlreport.write_report`` and ``trend.write_trend`` fill it.
"""

from __future__ import annotations

import html
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..core.atomic import write_text
from .dashboards import md_cell
from ..core.redact import redact

__all__ = ["NO_MATPLOTLIB", "PLOTS_DIR", "Document", "Written", "matplotlib_figure", "slug", "write_document"]

PLOTS_DIR = "plots"
NO_MATPLOTLIB = ("plots skipped: matplotlib is not installed (pip install 'fabric-gates[report]' "
                 "or pip install 'matplotlib>=3.7'); the tables are complete without them")


@dataclass
class Written:
    """What a report wrote, and anything the reader should be told about it."""

    markdown: Path
    html: Path
    plots: list[Path] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


class Document:
    def __init__(self, title: str) -> None:
        self.title = title
        self.blocks: list[tuple[str, Any]] = []

    def heading(self, text: str, level: int = 2) -> None:
        self.blocks.append(("heading", (level, text)))

    def para(self, text: str) -> None:
        self.blocks.append(("para", text))

    def bullets(self, items: Sequence[str]) -> None:
        if items:
            self.blocks.append(("bullets", list(items)))

    def table(self, header: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
        self.blocks.append(("table", ([str(h) for h in header], [[str(c) for c in r] for r in rows])))

    def image(self, relative: str, alt: str) -> None:
        self.blocks.append(("image", (relative, alt)))

    def markdown(self) -> str:
        out = [f"# {self.title}", ""]
        for kind, value in self.blocks:
            if kind == "heading":
                level, text = value
                out += [f"{'#' * level} {text}", ""]
            elif kind == "para":
                out += [value, ""]
            elif kind == "bullets":
                out += [f"- {item}" for item in value] + [""]
            elif kind == "table":
                header, rows = value
                out.append(_markdown_row(header))
                out.append("|" + "|".join("---:" if _numeric(rows, i) else "---" for i in range(len(header))) + "|")
                out += [_markdown_row(row) for row in rows]
                out.append("")
            elif kind == "image":
                relative, alt = value
                out += [f"![{alt}]({relative})", ""]
        return "\n".join(out)

    def html(self) -> str:
        e = html.escape
        body = [f"<h1>{e(self.title)}</h1>"]
        for kind, value in self.blocks:
            if kind == "heading":
                level, text = value
                body.append(f"<h{level}>{e(text)}</h{level}>")
            elif kind == "para":
                body.append(f"<p>{e(value)}</p>")
            elif kind == "bullets":
                body.append("<ul>" + "".join(f"<li>{e(item)}</li>" for item in value) + "</ul>")
            elif kind == "table":
                header, rows = value
                head = "".join(f"<th>{e(h)}</th>" for h in header)
                align = ["num" if _numeric(rows, i) else "text" for i in range(len(header))]
                trs = "".join("<tr>" + "".join(f'<td class="{a}">{e(c)}</td>' for a, c in zip(align, row)) + "</tr>"
                              for row in rows)
                body.append(f"<table><thead><tr>{head}</tr></thead><tbody>{trs}</tbody></table>")
            elif kind == "image":
                relative, alt = value
                body.append(f'<figure><img src="{e(relative)}" alt="{e(alt)}">'
                            f"<figcaption>{e(alt)}</figcaption></figure>")
        return (
            "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{e(self.title)}</title><style>{_CSS}</style></head>\n<body>\n"
            + "\n".join(body) + "\n</body></html>\n")


def _markdown_row(cells: Sequence[str]) -> str:
    return "| " + " | ".join(md_cell(c) for c in cells) + " |"


_NUMBER = re.compile(r"^[-+$]?[0-9.,]+(e[-+]?\d+)?%?$|^-$|^n/a$")


def _numeric(rows: Sequence[Sequence[str]], column: int) -> bool:
    """Right-align a column of numbers (placeholders aside), as the HTML does."""
    cells = [row[column] for row in rows if column < len(row)]
    return any(c not in ("-", "n/a") for c in cells) and all(_NUMBER.match(c) for c in cells)


_CSS = (
    "body{font-family:system-ui,sans-serif;margin:2em auto;max-width:72em;padding:0 1em;color:#222}"
    "h1,h2,h3{font-weight:600}h2{border-bottom:1px solid #ddd;padding-bottom:.2em;margin-top:1.6em}"
    "table{border-collapse:collapse;margin:.6em 0 1.2em}"
    "th,td{border:1px solid #ccc;padding:.25em .6em;text-align:left}"
    "td.num{text-align:right;font-variant-numeric:tabular-nums}th{background:#f3f3f3}"
    "tbody tr:nth-child(even){background:#fafafa}"
    "figure{margin:.5em 0 1.5em}img{max-width:100%;border:1px solid #eee}"
    "figcaption{font-size:.85em;color:#666}li{margin:.15em 0}"
)


def write_document(directory: Path, doc: Document, stem: str, plots: list[Path], notes: list[str]) -> Written:
    directory.mkdir(parents=True, exist_ok=True)
    markdown, page = directory / f"{stem}.md", directory / f"{stem}.html"
    for path, text in ((markdown, doc.markdown()), (page, doc.html())):
        write_text(path, redact(text))  # inputs may come from an older version or another tool
    return Written(markdown, page, plots, notes)


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_") or "plot"


def matplotlib_figure():
    """matplotlib's Figure class, or None: object-oriented API, Agg canvas, no global pyplot state."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        return None
    return Figure
