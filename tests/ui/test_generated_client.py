"""The UI cannot drift from the API: its types are what openapi-typescript generates from openapi.yaml, and the
committed bundle (app/ui/dist) is what its sources build.

Needs Node.js; without it these tests skip with the reason, unless OVERTAKE_REQUIRE_SERVICES=1 (then they fail).
The npm packages are installed from app/ui/package-lock.json when they are missing (`npm ci`).
"""

from __future__ import annotations

import filecmp
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import REQUIRE

ROOT = Path(__file__).resolve().parents[2]
UI = ROOT / "app" / "ui"
FIX = "run scripts/build-ui.sh and commit app/ui/src/api/schema.d.ts and app/ui/dist"


@pytest.fixture(scope="module")
def npm_packages() -> Path:
    if shutil.which("node") is None or shutil.which("npm") is None:
        reason = "Node.js (node and npm) is not installed: the UI's generated client cannot be checked"
        if REQUIRE:
            pytest.fail(reason + " (OVERTAKE_REQUIRE_SERVICES=1)")
        pytest.skip(reason)
    bin_dir = UI / "node_modules" / ".bin"
    if not (bin_dir / "openapi-typescript").exists() or not (bin_dir / "vite").exists():
        done = subprocess.run(
            ["npm", "ci", "--no-audit", "--no-fund"], cwd=UI, capture_output=True, text=True, timeout=600
        )
        assert done.returncode == 0, f"npm ci in app/ui failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
    return bin_dir


def test_ui_api_types_are_what_openapi_typescript_generates_from_the_contract(npm_packages, tmp_path):
    out = tmp_path / "schema.d.ts"
    done = subprocess.run(
        [str(npm_packages / "openapi-typescript"), str(ROOT / "openapi.yaml"), "-o", str(out)],
        cwd=UI,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    committed = UI / "src" / "api" / "schema.d.ts"
    assert committed.read_text() == out.read_text(), (
        f"app/ui/src/api/schema.d.ts drifted from openapi.yaml: {FIX}"
    )


def test_committed_ui_bundle_is_what_its_sources_build(npm_packages, tmp_path):
    out = tmp_path / "dist"
    done = subprocess.run(
        [str(npm_packages / "vite"), "build", "--outDir", str(out), "--emptyOutDir", "--logLevel", "error"],
        cwd=UI,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    built = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    committed = sorted(p.relative_to(UI / "dist").as_posix() for p in (UI / "dist").rglob("*") if p.is_file())
    assert built == committed, f"app/ui/dist is not what the sources build: {FIX}"
    _, mismatch, errors = filecmp.cmpfiles(out, UI / "dist", built, shallow=False)
    assert not mismatch and not errors, f"app/ui/dist differs in {mismatch + errors}: {FIX}"


def test_ui_sources_type_check_against_the_generated_types(npm_packages):
    done = subprocess.run(
        [str(npm_packages / "tsc"), "--noEmit", "-p", str(UI)],
        cwd=UI,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, f"the UI does not type-check against the API types:\n{done.stdout[-3000:]}"
