"""What every benchmark script writes the same way: the machine's load, and a results Markdown with its .json twin
(the developers' guide: each results file has a machine-readable twin with the figures its Markdown states).

Benchmark scripts run as `python bench/<script>.py`, so `bench/` is on their import path: `from results_io import
write_results`.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path


def uptime() -> str:
    """`uptime`'s whole line (time, up, users, load averages)."""
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def load_average() -> str:
    """The three load averages of `uptime`, e.g. '0.07, 1.03, 1.73'."""
    return uptime().split("load average:")[-1].strip()


def write_results(out: str | Path | None, markdown: str, figures: dict) -> None:
    """Print the Markdown; with `out`, write it there and `figures` beside it as the .json twin."""
    print(markdown)
    if out is None:
        return
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(markdown)
    out.with_suffix(".json").write_text(json.dumps(figures, indent=2) + "\n")
