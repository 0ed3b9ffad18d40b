"""Machine-readable twins of results written before twins were required: every Markdown table of a results file,
row by row, with its figures parsed as numbers where the cell is one number (1,234 / 0.76x / 12.5% / **3.1**).

    .venv/bin/python bench/md_twin.py bench/results/update_cpu.md ...   # writes bench/results/update_cpu.json

Results scripts that write their own `.json` (learning_evidence, threads, update_diagnosis, ...) do not need it.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import orjson

NUMBER = re.compile(r"^[+-]?(\d[\d,]*\.?\d*|\.\d+)(e[+-]?\d+)?$", re.IGNORECASE)


def cell_value(text: str):
    """A cell as a number when it states exactly one (unit x or % dropped, as the column says), else the text."""
    bare = text.strip().strip("*`").strip()
    unit = bare[-1:] if bare[-1:] in ("x", "%") else ""
    core = bare[:-1] if unit else bare
    if NUMBER.match(core):
        value = float(core.replace(",", ""))
        return int(value) if value.is_integer() and "." not in core and "e" not in core.lower() else value
    return text.strip()


def split_row(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def tables(markdown: str) -> list[dict]:
    """Each table under its nearest heading: column names and one dict per row."""
    out, section, lines = [], None, markdown.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("#"):
            section = line.lstrip("#").strip()
        is_table = line.lstrip().startswith("|") and i + 1 < len(lines) and \
            re.match(r"^\s*\|?\s*:?-{3,}", lines[i + 1])
        if not is_table:
            i += 1
            continue
        columns = split_row(line)
        rows = []
        i += 2
        while i < len(lines) and lines[i].lstrip().startswith("|"):
            cells = split_row(lines[i])
            rows.append({name: cell_value(cell) for name, cell in zip(columns, cells)})
            i += 1
        out.append({"section": section, "columns": columns, "rows": rows})
    return out


def twin(path: Path) -> dict:
    text = path.read_text()
    title = next((line.lstrip("#").strip() for line in text.splitlines() if line.startswith("#")), path.stem)
    return {"source": path.name, "title": title, "made_by": "bench/md_twin.py: the Markdown's tables as stated",
            "tables": tables(text)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", nargs="+", type=Path, help="results Markdown files")
    for path in ap.parse_args().results:
        out = path.with_suffix(".json")
        figures = twin(path)
        out.write_bytes(orjson.dumps(figures, option=orjson.OPT_INDENT_2) + b"\n")
        print(f"{out}: {len(figures['tables'])} table(s)")


if __name__ == "__main__":
    main()
