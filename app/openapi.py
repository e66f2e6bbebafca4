"""The API contract: renders the app's OpenAPI document as YAML; `python -m app.openapi` rewrites openapi.yaml."""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

CONTRACT = Path(__file__).resolve().parent.parent / "openapi.yaml"


def render() -> str:
    from app.main import create_app
    from app.settings import Settings

    spec = create_app(Settings(auto_migrate=False, scheduler_enabled=False)).openapi()
    header = "# Generated from the app by `python -m app.openapi`; do not edit. CI fails when it drifts.\n"
    return header + yaml.safe_dump(spec, sort_keys=False, allow_unicode=True, width=120)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    text = render()
    if argv and argv[0] == "--check":
        if not CONTRACT.exists() or CONTRACT.read_text() != text:
            print("openapi.yaml is out of date: run `python -m app.openapi`", file=sys.stderr)
            return 1
        return 0
    CONTRACT.write_text(text)
    print(f"wrote {CONTRACT.name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
