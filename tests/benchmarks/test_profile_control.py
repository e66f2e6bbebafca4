"""The control-path profile counts each sample once, under the innermost frame it knows."""

from benchmarks.profile_control import OTHER, _shares


def test_each_sample_is_counted_once_under_its_innermost_known_frame(tmp_path):
    raw = tmp_path / "stacks.txt"
    raw.write_text(
        "run (uvicorn/main.py:1);app (fastapi/routing.py:2);execute (sqlalchemy/orm/session.py:3);"
        "fetch (asyncpg/prepared_stmt.py:4) 6\n"
        "run (uvicorn/main.py:1);app (fastapi/routing.py:2);execute (sqlalchemy/orm/session.py:3) 3\n"
        "run (uvicorn/main.py:1);Runner.run (asyncio/runners.py:118) 1\n"
        "_bootstrap (threading.py:1) 2\n"
    )
    total, groups, top = _shares(raw)
    assert total == 12
    assert groups["PostgreSQL driver (asyncpg: bind, execute, fetch)"] == 6 / 12
    assert groups["SQLAlchemy (sessions, statements)"] == 3 / 12
    assert groups["HTTP and ASGI (uvicorn, Starlette, FastAPI, the guards)"] == 0
    assert groups[OTHER] == 2 / 12
    assert abs(sum(groups.values()) - 1) < 1e-9
    assert top[0] == ("fetch (asyncpg/prepared_stmt.py)", 6 / 12)
