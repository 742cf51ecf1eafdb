"""The report's document: one list of blocks, rendered as Markdown and as HTML that agree."""

from __future__ import annotations

from pytest_fabric.reporting.report_document import Document, slug, write_document


def document() -> Document:
    doc = Document("t <1>")
    doc.heading("Throughput")
    doc.para("a | b")
    doc.bullets([])  # nothing to list: no block
    doc.bullets(["one"])
    doc.table(["case", "tok/s"], [["m-n2-ib", "200.0"], ["m-n1-ib", "n/a"], ["x|y", "-"]])
    doc.image("plots/a.png", "a plot")
    return doc


def test_markdown_aligns_number_columns_right_and_escapes_cells():
    md = document().markdown()
    assert md.startswith("# t <1>\n\n## Throughput\n\na | b\n\n- one\n\n| case | tok/s |\n|---|---:|\n")
    assert "| x\\|y | - |" in md and "![a plot](plots/a.png)" in md


def test_html_holds_the_same_blocks_escaped():
    page = document().html()
    assert page.startswith("<!DOCTYPE html>") and "<title>t &lt;1&gt;</title>" in page
    assert '<td class="text">m-n2-ib</td><td class="num">200.0</td>' in page
    assert "<ul><li>one</li></ul>" in page and '<img src="plots/a.png" alt="a plot">' in page
    assert page.count("<ul>") == 1


def test_written_twice_with_secrets_masked(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_S3cr3tV4lue0123456789")
    doc = Document("report")
    doc.para("token hf_S3cr3tV4lue0123456789")
    written = write_document(tmp_path / "out", doc, "report", [], ["a note"])
    for path in (written.markdown, written.html):
        text = path.read_text()
        assert "token" in text and "hf_S3cr3tV4lue0123456789" not in text
    assert written.notes == ["a note"] and written.markdown.name == "report.md"


def test_slug_keeps_a_file_name_safe():
    assert slug("qwen2 / tiny") == "qwen2_tiny" and slug("///") == "plot"
