"""Shared fixtures: live coordinators (SQLite, PostgreSQL + Redis) and the real services they need.

PostgreSQL and Redis tests skip with a reason when the server is not reachable, S3 tests when moto's S3 server
cannot be started, and Kafka tests when the Tansu broker cannot be (``tests/kafka.py``), unless
OVERTAKE_REQUIRE_SERVICES=1 (set by .ci/run): then they fail.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from tests.kafka import durable_kafka_broker, kafka_broker, retake_kafka_test  # noqa: F401  (Kafka brokers)
from tests.live import LiveCoordinator, free_port

ROOT = Path(__file__).resolve().parents[1]
SPARK_SLOTS = 12
"""Task slots of the shared SparkSession: rescaled pipelines run up to 10 subtasks in one barrier stage."""

PG_ADMIN_URL = os.environ.get("OVERTAKE_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
REDIS_URL = os.environ.get("OVERTAKE_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
REQUIRE = os.environ.get("OVERTAKE_REQUIRE_SERVICES") == "1"


def _java_ok() -> bool:
    return os.environ.get("OVERTAKE_NO_JAVA") != "1" and shutil.which("java") is not None


def pytest_collection_modifyitems(config, items):
    """Without Java, Spark tests skip with a reason on a user's machine; under CI they run (and fail)."""
    if _java_ok() or REQUIRE:
        return
    skip = pytest.mark.skip(
        reason="PySpark needs Java 17+; none was found (install a JDK/JRE 17 to run Spark tests)"
    )
    for item in items:
        if "spark" in item.keywords:
            item.add_marker(skip)


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem):
    """Kafka tests are taken again when they met only Tansu's race of transactions ending together (tests/kafka.py)."""
    return True if retake_kafka_test(pyfuncitem) else None


@pytest.fixture(scope="session")
def spark():
    """One local SparkSession for the whole pytest session (each worker of `./dev.sh test`'s pytest-xdist run is a
    session of its own), whatever directory a test is in: local[12], few shuffle partitions, no UI; Python workers use
    this interpreter and can import the tests package.

    Code under test that gets or creates a session (a benchmark run in-process) gets this one when a test asked for
    it first. A session made before it with fewer slots is stopped and made again: a narrower session kept for the
    rest of the run would fail every wider pipeline after it with "needs N task slots".
    """
    from spark_plugin.driver.session import spark_session

    def make():
        return spark_session(SPARK_SLOTS, "overtake-tests", import_paths=[ROOT], pin_python=True,
                             config={"spark.driver.memory": "1g"})

    session = make()
    if session.sparkContext.master != f"local[{SPARK_SLOTS}]":
        session.stop()
        session = make()
    assert session.sparkContext.master == f"local[{SPARK_SLOTS}]", session.sparkContext.master
    yield session
    session.stop()


def _reachable(url: str, default_port: int) -> bool:
    from urllib.parse import urlparse

    u = urlparse(url)
    try:
        with socket.create_connection((u.hostname or "127.0.0.1", u.port or default_port), timeout=2):
            return True
    except OSError:
        return False


def need_service(name: str, url: str, port: int) -> None:
    if _reachable(url, port):
        return
    msg = f"{name} is not reachable at {url}"
    if REQUIRE:
        pytest.fail(msg + " (OVERTAKE_REQUIRE_SERVICES=1: service-backed tests must run)")
    pytest.skip(msg + "; start it or set OVERTAKE_TEST_POSTGRES_URL / OVERTAKE_TEST_REDIS_URL")


@pytest.fixture(scope="session")
def pg_server() -> str:
    need_service("PostgreSQL", PG_ADMIN_URL, 5432)
    return PG_ADMIN_URL


@pytest.fixture(scope="session")
def redis_url() -> str:
    need_service("Redis", REDIS_URL, 6379)
    return REDIS_URL


def _unavailable(msg: str) -> None:
    if REQUIRE:
        pytest.fail(msg + " (OVERTAKE_REQUIRE_SERVICES=1: service-backed tests must run)")
    pytest.skip(msg)


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory):
    """An S3-compatible server speaking the real HTTP S3 protocol (moto's standalone server) on a free port, for
    the session; yields its endpoint URL."""
    # the one installed beside this interpreter (the project's dev extra) first, any other on PATH after it
    own = Path(sys.executable).parent / "moto_server"
    exe = str(own) if own.exists() else (shutil.which("moto_server") or str(own))
    if not Path(exe).exists():
        _unavailable("moto's S3 server is not installed (pip install 'moto[server]'); S3 tests need it")
    for module in ("s3fs", "boto3"):
        try:
            __import__(module)
        except ImportError:
            _unavailable(f"{module} is not installed (pip install 'overtake[s3]'); S3 tests need it")
    port = free_port()
    log_path = tmp_path_factory.mktemp("moto") / "moto.log"
    log = open(log_path, "wb")
    proc = subprocess.Popen([exe, "-H", "127.0.0.1", "-p", str(port)], stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    try:
        while not _reachable(url, port):
            if proc.poll() is not None or time.monotonic() > deadline:
                _unavailable(f"moto's S3 server did not start on port {port}: {log_path.read_text()[-2000:]}")
            time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        log.close()


@pytest.fixture
def s3_bucket(s3_server, monkeypatch) -> str:
    """A fresh bucket on the S3 server, and the standard AWS variables that point s3fs and boto3 at it (for this
    test); returns the blob URL of a store rooted in it, ``s3://bucket/overtake``."""
    import boto3

    env = {
        "AWS_ENDPOINT_URL": s3_server,
        "AWS_ACCESS_KEY_ID": "overtake-test",
        "AWS_SECRET_ACCESS_KEY": "overtake-test-secret",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    bucket = f"overtake-{uuid.uuid4().hex[:12]}"
    boto3.client("s3").create_bucket(Bucket=bucket)
    return f"s3://{bucket}/overtake"


class PgDatabases:
    """Creates throw-away PostgreSQL databases and drops them at the end of the session."""

    def __init__(self, admin_url: str) -> None:
        self.admin_url = admin_url
        self.created: list[str] = []

    def new(self) -> str:
        import psycopg

        name = f"overtake_test_{uuid.uuid4().hex[:10]}"
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        self.created.append(name)
        base = self.admin_url.rsplit("/", 1)[0].replace("postgresql://", "postgresql+asyncpg://", 1)
        return f"{base}/{name}"

    def drop_all(self) -> None:
        import psycopg

        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            for name in self.created:
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="session")
def pg_databases(pg_server: str):
    dbs = PgDatabases(pg_server)
    yield dbs
    dbs.drop_all()


@pytest.fixture
def pg_url(pg_databases: PgDatabases) -> str:
    """A fresh, empty PostgreSQL database (asyncpg URL) for one test."""
    return pg_databases.new()


@pytest.fixture(scope="session")
def session_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("overtake")


@pytest.fixture(scope="session")
def coordinator(session_dir: Path):
    """A live coordinator (uvicorn subprocess) on SQLite, without auth, shared by the session."""
    live = LiveCoordinator(session_dir / "open", {})
    live.start()
    yield live
    live.stop()


@pytest.fixture(scope="session")
def secured_coordinator(session_dir: Path):
    """A live coordinator on SQLite with OVERTAKE_ADMIN_TOKEN set (`.admin_token`)."""
    live = LiveCoordinator(session_dir / "secured", {"OVERTAKE_ADMIN_TOKEN": "admin-" + uuid.uuid4().hex})
    live.start()
    yield live
    live.stop()


@pytest.fixture
def fresh_coordinator(tmp_path: Path):
    """A coordinator of this test's own (SQLite), for tests that kill or restart it."""
    live = LiveCoordinator(tmp_path / "coordinator", {})
    yield live
    live.stop()


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    d = tmp_path / "work"
    d.mkdir()
    yield d
    shutil.rmtree(d, ignore_errors=True)


__all__ = ["free_port"]
