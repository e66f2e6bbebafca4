"""The web UI in headless Chromium against a live coordinator holding real checkpoints.

Needs Python's ``playwright`` package and the system Chromium (``/usr/bin/chromium``; no browser is downloaded).
Without them these tests skip with the reason, unless OVERTAKE_REQUIRE_SERVICES=1 (then they fail).
Screenshots go to ``test-artifacts/ui/``; with OVERTAKE_UPDATE_SCREENSHOT=1 the job page's also becomes docs/ui.png.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import httpx
import pytest

from app.main import UI_DIST
from tests.conftest import REQUIRE
from tests.live import LiveCoordinator
from tests.ui.seed import GRAPH, Seeder

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "test-artifacts" / "ui"
CHROMIUM = os.environ.get("OVERTAKE_CHROMIUM", "/usr/bin/chromium")
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
TIMEOUT = 10_000


def _unavailable(reason: str) -> None:
    if REQUIRE:
        pytest.fail(reason + " (OVERTAKE_REQUIRE_SERVICES=1: browser tests must run)")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def browser():
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _unavailable("the browser tests need Python's playwright package (pip install playwright)")
    if not Path(CHROMIUM).exists():
        _unavailable(f"the browser tests need Chromium at {CHROMIUM} (apt-get install chromium)")
    if not (UI_DIST / "index.html").exists():
        pytest.fail("app/ui/dist is missing: run scripts/build-ui.sh")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS, headless=True)
        yield b
        b.close()


@pytest.fixture
def page(browser, request):
    context = browser.new_context(viewport={"width": 1440, "height": 1000})
    context.set_default_timeout(TIMEOUT)
    pg = context.new_page()
    errors: list[str] = []
    pg.on("pageerror", lambda e: errors.append(str(e)))
    yield pg
    pg.screenshot(path=str(ARTIFACTS / f"{request.node.name}.png"), full_page=True)
    context.close()
    assert not errors, f"JavaScript errors on the page: {errors}"


def _shot(page, name: str) -> Path:
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path


def _api(url: str, path: str, token: str | None = None) -> dict:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    r = httpx.get(url + path, headers=headers, timeout=10)
    r.raise_for_status()
    return r.json()


def _complete(url: str, job_id: int, cp: int, token: str | None = None) -> None:
    s = Seeder(url, token)
    try:
        for v in GRAPH["vertices"]:
            for i in range(v["parallelism"]):
                s.ack(job_id, cp, v["id"], i, unaligned=True, step=3, delay_ms=0)
    finally:
        s.close()


# --------------------------------------------------------------------------- pages render the real data


def test_jobs_page_lists_jobs_with_their_latest_checkpoint_and_counts(page, seeded):
    page.goto(seeded.url + "/")
    row = page.locator(f"tr[data-job='{seeded.orders}']")
    row.wait_for()
    job = _api(seeded.url, f"/api/v1/jobs/{seeded.orders}")
    text = row.inner_text()
    assert "orders" in text and "RUNNING" in text
    assert f"#{job['latest_completed_checkpoint_id']}" in text and "ago" in text
    cells = row.locator("td").all_inner_texts()
    assert cells[2] == "1" and cells[4] == str(job["num_completed"]) and cells[5] == str(job["num_failed"])
    assert "none yet" in page.locator(f"tr[data-job='{seeded.idle}']").inner_text()


def test_job_page_draws_the_graph_config_chart_and_history(page, seeded):
    page.goto(f"{seeded.url}/#/jobs/{seeded.orders}")
    page.locator("svg.graph").wait_for()
    vertices = page.locator("svg.graph g.vertex")
    assert vertices.count() == 3
    assert "parallelism 3" in page.locator("g[data-vertex='count']").text_content()
    assert page.locator("g[data-edge='source->count']").text_content() == "hash"
    assert page.locator("g[data-edge='count->sink']").text_content() == "rebalance"
    assert "aligned_then_unaligned (switch after 50 ms)" in page.locator(".config").inner_text()

    total = _api(seeded.url, f"/api/v1/jobs/{seeded.orders}/checkpoints?limit=1")["total"]
    page.locator(".chart rect.bar").first.wait_for()
    assert page.locator("g[data-panel='end-to-end duration'] rect.bar").count() == total
    assert page.locator("g[data-panel='end-to-end duration'] rect.bar-unaligned").count() >= 5
    assert page.locator("g[data-panel='end-to-end duration'] rect.bar-aligned").count() >= 3
    assert page.locator("g[data-panel='end-to-end duration'] rect.bar-savepoint").count() == 1
    assert page.locator("g[data-panel='end-to-end duration'] rect.bar-failed").count() == 1

    rows = page.locator("table.history tbody tr")
    assert rows.count() == min(total, 20)
    declined = page.locator(f"tr[data-checkpoint='{seeded.declined}']").inner_text()
    assert "ABORTED" in declined and "state backend unavailable" in declined
    savepoint = page.locator(f"tr[data-checkpoint='{seeded.savepoint}']").inner_text()
    assert "savepoint" in savepoint and "COMPLETED" in savepoint
    page.locator(".live-live").wait_for()
    shot = _shot(page, "job")
    if os.environ.get("OVERTAKE_UPDATE_SCREENSHOT") == "1":  # refresh the README's picture on purpose only
        shutil.copyfile(shot, ROOT / "docs" / "ui.png")


def test_checkpoint_page_highlights_the_slowest_subtasks_and_largest_channel_states(page, seeded):
    cp = seeded.unaligned_checkpoint
    page.goto(f"{seeded.url}/#/jobs/{seeded.orders}/checkpoints/{cp}")
    page.locator("table.subtasks").wait_for()
    detail = _api(seeded.url, f"/api/v1/jobs/{seeded.orders}/checkpoints/{cp}")
    assert page.locator("table.subtasks tbody tr").count() == len(detail["subtasks"]) == 6
    slowest = sorted(detail["subtasks"], key=lambda s: -s["end_to_end_duration"])[0]
    slow_row = page.locator(f"tr[data-subtask='{slowest['vertex']}[{slowest['subtask_index']}]']")
    assert "row-slow" in slow_row.get_attribute("class")
    assert page.locator("tr.row-slow").count() == 3
    large = {r.get_attribute("data-subtask") for r in page.locator("tr.row-large").all()}
    assert large == {"count[0]", "count[1]", "count[2]"}  # only they persisted channel state
    assert page.locator(".timeline g.ack-row").count() == 6
    assert page.locator(".timeline circle.ack-dot.unaligned").count() == 6


def test_in_flight_page_lists_segments_by_channel_and_previews_decoded_records(page, seeded):
    cp = seeded.unaligned_checkpoint
    page.goto(f"{seeded.url}/#/jobs/{seeded.orders}/checkpoints/{cp}/in-flight")
    page.locator("table.segments").wait_for()
    manifest = _api(seeded.url, f"/api/v1/jobs/{seeded.orders}/checkpoints/{cp}/channel-state")
    segments = [g for e in manifest["entries"] for g in e["segments"]]
    assert page.locator("table.segments tbody tr").count() == len(segments) == 9
    page.locator("tr[data-channel='in:source[0]->count[0]'] button").click()
    page.locator("table.records tbody tr").first.wait_for()
    first = page.locator("table.records tbody tr").first.inner_text()
    assert "('order-0', 0, Decimal('0.25'), datetime.datetime(2026, 11, 21, 12, 0" in first
    assert "{'late': True, 'tags': {" in page.locator("table.records").inner_text()
    page.locator("tr[data-channel='out:count[1]->sink[0]'] button").click()
    page.locator("tr.record-unsupported").wait_for()
    assert "collections.OrderedDict" in page.locator("tr.record-unsupported").inner_text()


def test_long_history_is_paged_and_charted(page, seeded, long_history_job):
    page.goto(f"{seeded.url}/#/jobs/{long_history_job}")
    info = page.locator(".pager .page-info")
    info.wait_for()
    assert "Page 1 of 50" in info.inner_text() and "1,000 in all" in info.inner_text()
    assert page.locator("table.history tbody tr").first.get_attribute("data-checkpoint") == "1000"
    page.get_by_role("button", name="Older ›").click()
    page.locator("tr[data-checkpoint='980']").wait_for()
    page.get_by_role("button", name="Oldest »").click()
    page.locator("tr[data-checkpoint='1']").wait_for()
    assert "Page 50 of 50" in info.inner_text()
    page.locator(".panel-head select").first.select_option("1000")
    page.wait_for_function(
        "document.querySelectorAll(\"g[data-panel='end-to-end duration'] rect.bar\").length === 1000"
    )


# --------------------------------------------------------------------------- actions and live updates


def test_trigger_button_creates_a_checkpoint(page, seeded):
    page.goto(f"{seeded.url}/#/jobs/{seeded.orders}")
    page.locator(".live-live").wait_for()
    before = _api(seeded.url, f"/api/v1/jobs/{seeded.orders}/checkpoints?limit=1")["items"][0]["id"]
    page.locator("#trigger-checkpoint").click()
    notice = page.locator(".notice-ok")
    notice.wait_for()
    latest = _api(seeded.url, f"/api/v1/jobs/{seeded.orders}/checkpoints?limit=1")["items"][0]
    assert latest["id"] > before and latest["status"] == "PENDING"
    assert f"Checkpoint #{latest['id']} triggered" in notice.inner_text()
    page.locator(f"tr[data-checkpoint='{latest['id']}']").wait_for()
    _complete(seeded.url, seeded.orders, latest["id"])


def test_a_completed_checkpoint_appears_live_without_reload(page, seeded):
    page.goto(f"{seeded.url}/#/jobs/{seeded.orders}")
    page.locator(".live-live").wait_for()
    page.evaluate("window.__noReload = true")
    s = Seeder(seeded.url)
    try:
        cp = s.trigger(seeded.orders)
    finally:
        s.close()
    row = page.locator(f"tr[data-checkpoint='{cp}']")
    row.wait_for()
    assert "PENDING" in row.inner_text()
    _complete(seeded.url, seeded.orders, cp)
    page.wait_for_function(
        f"document.querySelector(\"tr[data-checkpoint='{cp}']\").innerText.includes('COMPLETED')"
    )
    page.locator("li[data-event='checkpoint.completed']").first.wait_for()
    assert page.evaluate("window.__noReload") is True


# --------------------------------------------------------------------------- empty states and errors


def test_a_job_without_checkpoints_says_so(page, seeded):
    page.goto(f"{seeded.url}/#/jobs/{seeded.idle}")
    page.get_by_text("No checkpoints yet. Trigger one").wait_for()
    assert page.locator("svg.graph g.vertex").count() == 3


def test_an_unknown_job_is_reported_as_not_found(page, seeded):
    page.goto(f"{seeded.url}/#/jobs/987654")
    page.get_by_text("Job 987654 not found").wait_for()
    assert page.get_by_role("link", name="See all jobs").is_visible()


def test_secured_coordinator_asks_for_the_admin_token_and_uses_it(page, secured_coordinator):
    url, token = secured_coordinator.url, secured_coordinator.admin_token
    s = Seeder(url, token)
    try:
        job = s.job("secured-orders")
        task_token = s.attempt(job["id"])
    finally:
        s.close()
    page.goto(url + "/")
    page.get_by_text("Authentication required").wait_for()
    page.fill("input[name=token]", "not-the-token")
    page.get_by_role("button", name="Use token").click()
    page.get_by_text("the token is not valid for this coordinator").wait_for()
    page.fill("input[name=token]", task_token)
    page.get_by_role("button", name="Use token").click()
    page.get_by_role("heading", name="Not allowed").wait_for()
    assert "a task token cannot use management routes" in page.locator(".error-panel").inner_text()
    page.fill("input[name=token]", token)
    page.get_by_role("button", name="Use token").click()
    page.locator(f"tr[data-job='{job['id']}']").wait_for()

    page.goto(f"{url}/#/jobs/{job['id']}")
    page.locator(".live-live").wait_for()
    page.evaluate("sessionStorage.clear()")  # the token is gone, as after it was rotated
    page.locator("#trigger-savepoint").click()
    dialog = page.locator("dialog.token-dialog")
    dialog.wait_for()
    assert "needs the admin token" in dialog.inner_text()
    dialog.locator("input").fill(token)
    dialog.get_by_role("button", name="Use token").click()
    page.locator(".notice-ok").wait_for()
    cps = _api(url, f"/api/v1/jobs/{job['id']}/checkpoints", token)["items"]
    assert len(cps) == 1 and cps[0]["is_savepoint"]


def test_an_empty_coordinator_says_so_and_an_unreachable_one_is_reported(page, tmp_path):
    live = LiveCoordinator(tmp_path / "coordinator", {}).start()
    try:
        page.goto(live.url + "/")
        page.get_by_text("No jobs yet").wait_for()
        s = Seeder(live.url)
        s.job("soon-gone")
        s.close()
        page.reload()
        page.locator("tr[data-job='1']").wait_for()
    finally:
        live.stop()
    page.evaluate("location.hash = '#/jobs/1'")
    page.get_by_text("Coordinator unreachable").wait_for()
    assert page.get_by_role("button", name="Retry").is_visible()


def test_a_pending_checkpoints_page_follows_its_acks_to_completion(page, seeded):
    s = Seeder(seeded.url)
    try:
        cp = s.trigger(seeded.orders)
        page.goto(f"{seeded.url}/#/jobs/{seeded.orders}/checkpoints/{cp}")
        page.get_by_text("Waiting for 6 subtask(s)").wait_for()
        s.ack(seeded.orders, cp, "source", 0, unaligned=True, step=3, delay_ms=0)  # as _complete acks it
        page.get_by_text("Waiting for 5 subtask(s)").wait_for()
    finally:
        s.close()
    _complete(seeded.url, seeded.orders, cp)
    page.locator("h1 .status-completed").wait_for()
    assert page.locator("table.subtasks tbody tr").count() == 6
