"""The layers of the code base hold: import-linter checks the contracts in pyproject.toml ([tool.importlinter]).

The packages stand on each other in layers (cli > benchmarks > app | spark_plugin > client > contract), the
coordinator does not import its SDK, the runtime's folders follow where their code runs, and no modules of a
package import each other in a circle. A broken contract fails with import-linter's report of the imports at fault.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_import_contracts_are_kept():
    lint = shutil.which("lint-imports", path=str(Path(sys.executable).parent)) or shutil.which("lint-imports")
    assert lint, "import-linter is not installed (it is in the dev extra: pip install -e '.[dev]')"
    done = subprocess.run([lint, "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"an import contract is broken:\n{done.stdout[-6000:]}\n{done.stderr[-2000:]}"
    assert "0 broken" in done.stdout
