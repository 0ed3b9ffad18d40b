"""The README's commands are the ones CI runs, and every command's --help is in docs/cli.md."""

import re
import subprocess
import sys

from conftest import ROOT


def test_readme_test_command_is_what_ci_runs():
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```bash\n(.*?)\n```", readme, flags=re.S)
    install, test = blocks[0].strip(), blocks[1].strip()
    assert install.startswith("bash scripts/install.sh && .venv/bin/cosearch ")
    ci = (ROOT / ".ci" / "run").read_text()
    assert "bash scripts/install.sh" in ci
    assert ci.strip().splitlines()[-1] == test


def test_cli_reference_is_current():
    sys.path.insert(0, str(ROOT / "scripts"))
    import gen_cli_docs

    current = (ROOT / "docs" / "cli.md").read_text()
    assert current == gen_cli_docs.render(), "run: python scripts/gen_cli_docs.py"
    for name in gen_cli_docs.command_names():
        assert f"## `cosearch {name}`" in current


def test_module_entry_point_runs():
    result = subprocess.run([sys.executable, "-m", "cosearch_cli", "--version"], capture_output=True, text=True)
    assert result.returncode == 0 and result.stdout.startswith("cosearch ")
