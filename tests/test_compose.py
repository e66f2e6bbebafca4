"""The compose stack and its images, checked without a container runtime: the services, their volumes and their
commands, and that what each image runs exists in the project (the entry point, its subcommand and options, the
health check's route), and that a volume a non-root image writes is created in the image owned by that user."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
import typer.main
import yaml

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
DOCKER = ROOT / "docker"


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load((DOCKER / "compose.yaml").read_text())


def dockerfile(service: dict) -> tuple[Path, list[str]]:
    build = service["build"]
    path = (DOCKER / build["context"] / build["dockerfile"]).resolve()
    lines, current = [], ""
    for raw in path.read_text().splitlines():  # join continued lines, drop comments
        if raw.lstrip().startswith("#"):
            continue
        current += raw.rstrip("\\").strip() + " "
        if not raw.endswith("\\"):
            if current.strip():
                lines.append(current.strip())
            current = ""
    return path, lines


def instruction(lines: list[str], name: str) -> list[str]:
    return [line[len(name) + 1 :] for line in lines if line.split(" ", 1)[0] == name]


def cmd(lines: list[str]) -> list[str]:
    (last,) = instruction(lines, "CMD")[-1:]
    argv = json.loads(last)
    if argv[:2] == ["sh", "-c"]:
        return shlex.split(argv[2])
    return argv


def test_the_stack_has_its_services_and_declares_every_volume_it_mounts(compose):
    services = compose["services"]
    assert {"postgres", "redis", "coordinator", "coordinator-replica", "spark-demo"} <= set(services)
    for name, service in services.items():
        for mount in service.get("volumes", []):
            source = mount.split(":")[0]
            if not source.startswith((".", "/")):
                assert source in compose["volumes"], f"{name} mounts volume {source!r}, which is not declared"
    for name in ("coordinator", "coordinator-replica"):
        env = services[name]["environment"]
        assert env["OVERTAKE_DATABASE_URL"].startswith("postgresql+asyncpg://") and "@postgres:" in env["OVERTAKE_DATABASE_URL"]
        assert env["OVERTAKE_REDIS_URL"].startswith("redis://redis:")
        assert services[name]["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert services["spark-demo"]["environment"]["OVERTAKE_URL"] == "http://coordinator:8321"


def test_every_image_copies_what_it_installs_and_installs_its_extras(compose):
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    for name in ("coordinator", "spark-demo"):
        path, lines = dockerfile(compose["services"][name])
        copied = {line.split()[0] for line in instruction(lines, "COPY")} | {
            part for line in instruction(lines, "COPY") for part in line.split()[:-1]
        }
        for source in copied:
            assert (ROOT / source).exists(), f"{path.name} copies {source}, which is not in the project"
        for package in ("app", "cli", "client", "contract", "migrations", "spark_plugin", "benchmarks"):
            assert package in copied, f"{path.name} does not copy {package}/, which the package includes"
        install = next(line for line in instruction(lines, "RUN") if "pip install" in line)
        extras = re.search(r"'\.\[([a-z0-9,]+)\]'", install).group(1).split(",")
        assert set(extras) <= set(project["optional-dependencies"]), f"{path.name} installs unknown extras {extras}"
        assert "-c requirements/lock.txt" in install
    assert "postgres" in extras and "spark" in extras  # the demo image runs PySpark


def test_each_images_command_is_a_command_of_the_project(compose):
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    from cli.main import app

    group = typer.main.get_command(app)
    for name in ("coordinator", "spark-demo"):
        _, lines = dockerfile(compose["services"][name])
        argv = compose["services"][name].get("command") or cmd(lines)
        assert argv[0] in scripts, f"{name} runs {argv[0]!r}, which the package does not install"
        command = group.commands[argv[1]]
        known = {opt for p in command.params for opt in p.opts + p.secondary_opts}
        for arg in argv[2:]:
            if arg.startswith("--"):
                assert arg.split("=")[0] in known, f"{name}: 'overtake {argv[1]}' has no option {arg}"


def test_the_health_check_asks_a_route_of_the_coordinator(compose):
    from app.main import create_app

    routes = set(create_app().openapi()["paths"])
    _, lines = dockerfile(compose["services"]["coordinator"])
    (check,) = instruction(lines, "HEALTHCHECK")
    path = re.search(r"http://127\.0\.0\.1:8321(/[a-z]+)", check).group(1)
    assert path in routes


def test_volumes_a_non_root_image_writes_are_created_in_it_owned_by_its_user(compose):
    for name in ("coordinator", "coordinator-replica"):
        service = compose["services"][name]
        _, lines = dockerfile(service)
        (user,) = instruction(lines, "USER")
        setup = " ".join(instruction(lines, "RUN"))
        for mount in service.get("volumes", []):
            target = mount.split(":")[1]
            made = re.search(rf"mkdir -p [^&]*{re.escape(target)}", setup)
            owned = re.search(rf"chown -R {user}(:{user})? (\S+)", setup)
            assert made, f"{name}: the image does not create {target}, so a new volume there is root's"
            assert owned and target.startswith(owned.group(2)), f"{name}: {target} is not chowned to {user}"
