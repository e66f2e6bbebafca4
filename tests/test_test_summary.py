"""`./dev.sh test` ends with the report's failures, read from pytest's own JUnit XML."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_summary_names_each_failed_and_errored_test_with_its_message_and_the_totals(tmp_path):
    (tmp_path / "test_sample.py").write_text(
        "import pytest\n"
        "def test_ok():\n    assert True\n"
        "def test_bad():\n    assert 1 == 2, 'one is not two'\n"
        "@pytest.fixture\ndef broken():\n    raise RuntimeError('fixture broke')\n"
        "def test_err(broken):\n    pass\n"
        "@pytest.mark.skip(reason='not here')\ndef test_skipped():\n    pass\n"
    )
    report = tmp_path / "report.xml"
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={report}", str(tmp_path)],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )
    assert run.returncode == 1, run.stdout + run.stderr
    out = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "test_summary.py"), str(report)],
        capture_output=True, text=True, timeout=60,
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("==> test report: 1 passed, 1 failed, 1 errors, 1 skipped"), lines
    assert any(line.strip().startswith("FAILURE") and "test_bad" in line and "one is not two" in line for line in lines), lines
    assert any(line.strip().startswith("ERROR") and "test_err" in line and "fixture broke" in line for line in lines), lines
    assert not any("test_ok" in line or "test_skipped" in line for line in lines[1:]), lines


def test_a_missing_report_is_said_plainly(tmp_path):
    out = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "test_summary.py"), str(tmp_path / "none.xml")],
        capture_output=True, text=True, timeout=60,
    )
    assert out.returncode == 1
    assert "no test report" in out.stdout
