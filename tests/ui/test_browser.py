"""The web UI in headless Chromium against a live coordinator holding real checkpoints.

Needs Python's ``playwright`` package and the system Chromium (``/usr/bin/chromium``; no browser is downloaded).
Without them these tests skip with the reason, unless OVERTAKE_REQUIRE_SERVICES=1 (then they fail).
Screenshots go to ``test-artifacts/ui/``; with OVERTAKE_UPDATE_SCREENSHOT=1 the job page's also becomes docs/ui.png
and the checkpoint page's docs/ui-checkpoint.png (the README's pictures).
"""

from __future__ import annotations

import os
import re
import shutil
import time
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


@pytest.fixture(scope="module")  # Playwright's sync API runs an event loop while open: close it with this module,
def browser():  # so asyncio-based tests after it in the same session can start their own
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


def _shot(page, name: str, readme: str | None = None) -> Path:
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    if readme and os.environ.get("OVERTAKE_UPDATE_SCREENSHOT") == "1":  # refresh the README's picture on purpose only
        shutil.copyfile(path, ROOT / "docs" / readme)
    return path


def _post(url: str, path: str, body: dict | None = None, token: str | None = None) -> dict:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    r = httpx.post(url + path, json=body or {}, headers=headers, timeout=10)
    assert r.status_code < 300, f"POST {path}: {r.status_code} {r.text}"
    return r.json() if r.content else {}


def _report_live(
    url: str,
    job_id: int,
    figures: dict[tuple[str, int], tuple[float, float]],
    lags: dict[tuple[str, int], tuple[int, bool]] | None = None,
    splits: dict[tuple[str, int], dict] | None = None,
) -> None:
    """Live metrics of the job's current attempt, as its subtasks would report them: (records/s, backpressure), and
    for those in ``lags`` a watermark that trails the report's timestamp by the lag (ms), and whether it is idle;
    for those in ``splits`` their splits (the ``splits`` and ``splits_more`` fields)."""
    attempt = _api(url, f"/api/v1/jobs/{job_id}")["current_attempt"]
    for (vertex, index), (records, backpressure) in figures.items():
        now = int(time.time() * 1000)
        metrics = {"window_ms": 5000, "records_in_per_second": records, "backpressure": backpressure}
        if lags and (vertex, index) in lags:
            lag, idle = lags[(vertex, index)]
            metrics |= {"watermark": now - lag, "watermark_lag_ms": lag, "watermark_idle": idle}
        if splits and (vertex, index) in splits:
            metrics |= splits[(vertex, index)]
        r = httpx.post(
            f"{url}/api/v1/jobs/{job_id}/attempts/{attempt}/subtasks/{vertex}/{index}/metrics",
            json={"timestamp": now, "metrics": metrics},
            timeout=10,
        )
        assert r.status_code == 204, r.text


LIVE = {("source", 0): (2100.0, 0.82), ("source", 1): (1900.0, 0.78), ("count", 0): (1400.0, 0.04),
        ("count", 1): (1300.0, 0.03), ("count", 2): (1300.0, 0.02), ("sink", 0): (4000.0, 0.0)}
LAGS = {("source", 0): (1500, False), ("source", 1): (1200, False), ("count", 0): (60_000, True),
        ("count", 1): (800, False), ("count", 2): (900, False)}  # the sink has no event time


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
    assert cells[5] == "1" and cells[7] == str(job["num_completed"]) and cells[8] == str(job["num_failed"])
    # its policy, when it was created and for how long it has been running
    assert cells[2] == "aligned_then_unaligned" and ":" in cells[3]
    assert re.fullmatch(r"\d+(\.\d+)? (ms|s)|\d+ min \d+ s", cells[4]), cells[4]
    assert "none yet" in page.locator(f"tr[data-job='{seeded.idle}']").inner_text()


def test_job_page_sums_up_its_completed_checkpoints_with_min_avg_and_max(page, seeded):
    page.goto(f"{seeded.url}/#/jobs/{seeded.orders}")
    table = page.locator("table.job-summary")
    table.wait_for()
    summary = _api(seeded.url, f"/api/v1/jobs/{seeded.orders}/checkpoints/stats")["summary"]
    cells = table.locator("tr[data-figure='End to end'] td.num").all_inner_texts()
    assert len(cells) == 3 and cells[0] != cells[2] and "–" not in cells
    assert summary["end_to_end_duration"]["min"] < summary["end_to_end_duration"]["max"]
    assert f"{len(seeded.completed)} completed checkpoints" in table.locator("caption").inner_text()


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
    _report_live(seeded.url, seeded.orders, LIVE, LAGS)
    page.wait_for_function("document.querySelector(\"[data-live='source']\").textContent.includes('backpressure')")
    _shot(page, "job", readme="ui.png")


def test_checkpoint_page_highlights_only_outlying_subtasks(page, seeded):
    cp = seeded.unaligned_checkpoint
    page.goto(f"{seeded.url}/#/jobs/{seeded.orders}/checkpoints/{cp}")
    page.locator("table.subtasks").wait_for()
    detail = _api(seeded.url, f"/api/v1/jobs/{seeded.orders}/checkpoints/{cp}")
    assert page.locator("table.subtasks tbody tr").count() == len(detail["subtasks"]) == 6
    slow = [r.get_attribute("data-subtask") for r in page.locator("tr.row-slow").all()]
    slowest = max(detail["subtasks"], key=lambda s: s["end_to_end_duration"])
    assert slow in ([], [f"{slowest['vertex']}[{slowest['subtask_index']}]"])  # one in ten of 6: at most one
    large = [r.get_attribute("data-subtask") for r in page.locator("tr.row-large").all()]
    assert large == ["count[2]"]  # the largest channel state, far above the median (half persisted none)
    assert page.locator(".timeline g.ack-row").count() == 6
    assert page.locator(".timeline circle.ack-dot.unaligned").count() == 6
    assert "upload of the state" in page.locator(".timeline .legend").inner_text()
    assert "the upload is not in this figure" in page.locator(".async-note").inner_text()
    _shot(page, "checkpoint", readme="ui-checkpoint.png")


def test_an_even_checkpoint_highlights_nothing(page, seeded):
    aligned = next(c for c in seeded.completed if _api(
        seeded.url, f"/api/v1/jobs/{seeded.orders}/checkpoints/{c}")["subtask_modes"]["unaligned"] == 0)
    page.goto(f"{seeded.url}/#/jobs/{seeded.orders}/checkpoints/{aligned}")
    page.locator("table.subtasks").wait_for()
    assert page.locator("tr.row-large").count() == 0  # nothing persisted: no largest channel state


def test_checkpoint_page_sums_up_each_vertex_with_min_avg_and_max(page, seeded):
    cp = seeded.unaligned_checkpoint
    page.goto(f"{seeded.url}/#/jobs/{seeded.orders}/checkpoints/{cp}")
    page.locator("table.vertex-summary").wait_for()
    assert page.locator("table.vertex-summary tr.first-of-vertex").count() == 3
    processed = [  # the seed acks count[i] with 4 KiB * (i + 1) processed
        page.locator(f"table.vertex-summary tr[data-vertex='count'][data-stat='{stat}'] td.num").nth(6).inner_text()
        for stat in ("min", "avg", "max")
    ]
    assert processed == ["4.0 KiB", "8.0 KiB", "12 KiB"]
    first = page.locator("table.vertex-summary tr[data-vertex='count'][data-stat='min']").inner_text()
    assert "3/3" in first and "3 unaligned" in first


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


# --------------------------------------------------------------------------- honest states


def _running_job(url: str, name: str, **checkpoint) -> tuple[int, str]:
    s = Seeder(url)
    try:
        job = s.job(name, **checkpoint)
        return job["id"], s.attempt(job["id"])
    finally:
        s.close()


def test_an_ended_job_offers_no_trigger_and_is_not_shown_live(page, seeded):
    job_id, _ = _running_job(seeded.url, "ended")
    _post(seeded.url, f"/api/v1/jobs/{job_id}/finish", {"status": "FINISHED", "message": "input exhausted"})
    page.goto(f"{seeded.url}/#/jobs/{job_id}")
    page.locator(".live-ended").wait_for()
    assert "ended" in page.locator(".live").inner_text() and "live" not in page.locator(".live").inner_text()
    assert "takes no more checkpoints" in page.locator(".ended-note").inner_text()
    for button in ("#trigger-checkpoint", "#trigger-savepoint", "#stop-with-savepoint", "#cancel-job"):
        assert page.locator(button).count() == 0
    assert "input exhausted" in page.locator(".status-message").inner_text()


def test_cancel_asks_for_confirmation_and_then_cancels(page, seeded):
    job_id, _ = _running_job(seeded.url, "to-cancel")
    page.goto(f"{seeded.url}/#/jobs/{job_id}")
    page.locator(".live-live").wait_for()
    page.locator("#cancel-job").click()
    dialog = page.locator("dialog.confirm-dialog")
    assert "cannot be started again" in dialog.inner_text()
    dialog.get_by_role("button", name="Keep running").click()
    assert _api(seeded.url, f"/api/v1/jobs/{job_id}")["status"] == "RUNNING"
    page.locator("#cancel-job").click()
    page.locator("dialog.confirm-dialog").get_by_role("button", name="Cancel job").click()
    page.locator("h1 .status-cancelled").wait_for()
    assert _api(seeded.url, f"/api/v1/jobs/{job_id}")["status"] == "CANCELLED"
    assert page.locator("#trigger-checkpoint").count() == 0
    page.locator(".live-ended").wait_for()


def test_stop_with_savepoint_asks_for_confirmation_and_the_job_finishes_with_it(page, seeded):
    job_id, token = _running_job(seeded.url, "to-stop")
    page.goto(f"{seeded.url}/#/jobs/{job_id}")
    page.locator(".live-live").wait_for()
    page.locator("#stop-with-savepoint").click()
    page.locator("dialog.confirm-dialog").get_by_role("button", name="Stop with savepoint").click()
    page.locator(".notice-ok").wait_for()
    (sp,) = _api(seeded.url, f"/api/v1/jobs/{job_id}/checkpoints")["items"]
    assert sp["is_savepoint"] and sp["stop_job"]
    assert f"Savepoint #{sp['id']} triggered; the job stops once it completes" in page.locator(".notice-ok").inner_text()
    _complete(seeded.url, job_id, sp["id"])
    page.locator("h1 .status-finished").wait_for()  # followed live: the job ended with its savepoint
    page.locator(".live-ended").wait_for()
    # nothing stays as it was while the job ran: the notice, and the counts beside "Latest completed"
    page.get_by_text("The job ended: it is FINISHED.").wait_for()
    assert "stops once it completes" not in page.locator("main").inner_text()
    page.locator(".card", has_text="Savepoints").locator(".card-value", has_text="1").wait_for()
    page.locator(".card", has_text="Completed").first.locator(".card-value", has_text="1").wait_for()


def test_cancel_confirmation_is_red_as_what_cannot_be_undone(page, seeded):
    job_id, _ = _running_job(seeded.url, "red-cancel")
    page.goto(f"{seeded.url}/#/jobs/{job_id}")
    page.locator("#cancel-job").click()
    confirm = page.locator("dialog.confirm-dialog").get_by_role("button", name="Cancel job")
    color = confirm.evaluate("b => getComputedStyle(b).backgroundColor")
    assert color == "rgb(180, 35, 35)", color
    page.locator("dialog.confirm-dialog").get_by_role("button", name="Keep running").click()


def test_the_last_checkpoint_cut_short_by_a_normal_end_is_not_a_failure(page, seeded):
    job_id, _ = _running_job(seeded.url, "normal-end")
    s = Seeder(seeded.url)
    try:
        done = s.checkpoint(job_id, GRAPH, unaligned=True, step=1)
        last = s.trigger(job_id)
    finally:
        s.close()
    _post(seeded.url, f"/api/v1/jobs/{job_id}/finish", {"status": "FINISHED"})
    page.goto(f"{seeded.url}/#/jobs/{job_id}")
    row = page.locator(f"tr[data-checkpoint='{last}']")
    row.wait_for()
    assert "row-interrupted" in row.get_attribute("class") and "NOT FINISHED" in row.inner_text()
    assert "not a failure" in row.locator(".status-interrupted").get_attribute("title")
    failed = page.locator(".card", has_text="Failed")
    assert failed.locator(".card-value").inner_text() == "0" and "bad" not in failed.get_attribute("class")
    assert "1 not finished" in failed.inner_text()
    # the chart draws from its own request: wait for it, as for the table
    page.locator(f"g[data-panel='end-to-end duration'] rect.bar-interrupted[data-checkpoint='{last}']").wait_for()
    assert page.locator("g[data-panel='end-to-end duration'] rect.bar-failed").count() == 0

    page.goto(f"{seeded.url}/#/jobs/{job_id}/checkpoints/{last}")
    notice = page.locator(".abort-notice")
    notice.wait_for()
    assert "Not completed, not a failure" in notice.inner_text() and "the job ended" in notice.inner_text()
    assert page.locator("h1 .status-interrupted").inner_text() == "NOT FINISHED"
    assert "No subtask acknowledged it." in page.locator("main").inner_text()
    assert "Waiting for" not in page.locator("main").inner_text()
    assert "notice-bad" not in notice.get_attribute("class")
    assert done


def test_a_declined_checkpoint_is_a_failure_that_says_why(page, seeded):
    page.goto(f"{seeded.url}/#/jobs/{seeded.orders}/checkpoints/{seeded.declined}")
    notice = page.locator(".abort-notice")
    notice.wait_for()
    assert "notice-bad" in notice.get_attribute("class")
    text = notice.inner_text()
    assert text.startswith("Failed") and "a subtask could not take it" in text and "state backend unavailable" in text
    assert "Waiting for" not in page.locator("main").inner_text()
    # who never acknowledged it: every subtask here (declined before any ack)
    assert notice.locator(".never-acked").inner_text().startswith("Never acknowledged (6): source[0], source[1]")


def test_the_in_flight_page_of_a_checkpoint_collected_by_retention_says_so_and_when(page, seeded):
    job_id, _ = _running_job(seeded.url, "retention", retained=1)
    s = Seeder(seeded.url)
    try:
        old = s.checkpoint(job_id, GRAPH, unaligned=True, step=2)
        s.checkpoint(job_id, GRAPH, unaligned=True, step=3)
    finally:
        s.close()
    manifest = _api(seeded.url, f"/api/v1/jobs/{job_id}/checkpoints/{old}/channel-state")
    assert manifest["deleted_reason"] == "retention"
    page.goto(f"{seeded.url}/#/jobs/{job_id}/checkpoints/{old}/in-flight")
    notice = page.locator(".deleted-notice")
    notice.wait_for()
    assert "deleted by retention at" in notice.inner_text() and "'retained' setting" in notice.inner_text()
    assert page.locator("table.segments tbody tr").count() == sum(len(e["segments"]) for e in manifest["entries"])
    assert page.get_by_role("button", name="Preview").count() == 0  # nothing left to read, nothing to retry


def test_attempts_show_the_restored_checkpoint_the_fallback_and_its_reason_and_a_rescale(page, seeded, coordinator):
    job_id, _ = _running_job(seeded.url, "recovered", retained=3)
    s = Seeder(seeded.url)
    try:
        older = s.checkpoint(job_id, GRAPH, unaligned=False, step=1)
        newer = s.checkpoint(job_id, GRAPH, unaligned=False, step=2)
    finally:
        s.close()
    blob = _api(seeded.url, f"/api/v1/jobs/{job_id}/checkpoints/{newer}")["subtasks"][0]["operator_state"]
    (path,) = list((coordinator.data_dir / "blobs").rglob(blob["blob_id"] + "*"))
    path.write_bytes(path.read_bytes()[:-7])  # cut short: the restore check (a stat per object) finds it
    cause = "restart 1 after: org.apache.spark.SparkException: Job aborted due to stage failure"
    _post(seeded.url, f"/api/v1/jobs/{job_id}/attempts", {"parallelism": {"sink": 2}, "reason": cause})
    page.goto(f"{seeded.url}/#/jobs/{job_id}")
    row = page.locator("table.attempts tr[data-attempt='2']")
    row.wait_for()
    # the cause of the restart is labelled under the running job's title, and is why attempt 1 ended
    assert page.locator(".status-message").inner_text() == f"Why attempt 2 started (the job restarted): {cause}"
    assert page.locator("table.attempts tr[data-attempt='1'] td.end-reason").inner_text() == cause
    assert row.locator("td.end-reason").inner_text() == "running"
    assert f"checkpoint #{older}" in row.locator("td.restored").inner_text()
    fallback = row.locator("td.fallback").inner_text()
    assert f"#{newer}" in fallback and "cut or overwritten" in fallback
    assert "sink: 1 → 2" in row.locator("td.rescaled").inner_text()
    assert "fresh start" in page.locator("table.attempts tr[data-attempt='1']").inner_text()
    assert "current" in row.inner_text()
    _shot(page, "attempts")


def test_the_warm_up_checkpoint_does_not_set_the_charts_scale_or_the_percentiles(page, seeded):
    job_id, _ = _running_job(seeded.url, "warm-up")
    s = Seeder(seeded.url)
    try:
        warm = s.trigger(job_id)
        time.sleep(3)  # the first checkpoint waits for the tasks to start
        for v in GRAPH["vertices"]:
            for i in range(v["parallelism"]):
                s.ack(job_id, warm, v["id"], i, unaligned=False, step=0, delay_ms=0)
        for step in range(6):
            s.checkpoint(job_id, GRAPH, unaligned=True, step=step)
        savepoint = s.trigger(job_id, savepoint=True)  # a slow savepoint sets the scale no more than warm-up
        time.sleep(1.5)
        for v in GRAPH["vertices"]:
            for i in range(v["parallelism"]):
                s.ack(job_id, savepoint, v["id"], i, unaligned=False, step=0, delay_ms=0)
    finally:
        s.close()
    items = _api(seeded.url, f"/api/v1/jobs/{job_id}/checkpoints")["items"]
    steady_max = max(c["end_to_end_duration"] for c in items if c["id"] not in (warm, savepoint))
    warm_duration = next(c["end_to_end_duration"] for c in items if c["id"] == warm)
    assert warm_duration > steady_max
    assert next(c["end_to_end_duration"] for c in items if c["id"] == savepoint) > steady_max
    page.goto(f"{seeded.url}/#/jobs/{job_id}")
    bar = page.locator(f"g[data-panel='end-to-end duration'] rect[data-checkpoint='{warm}']")
    bar.wait_for()
    assert "bar-clipped" in bar.get_attribute("class") and "bar-warm" in bar.get_attribute("class")
    sp_bar = page.locator(f"g[data-panel='end-to-end duration'] rect[data-checkpoint='{savepoint}']")
    assert "bar-clipped" in sp_bar.get_attribute("class") and "bar-savepoint" in sp_bar.get_attribute("class")
    scale = float(page.locator("g[data-panel='end-to-end duration']").get_attribute("data-scale"))
    assert scale == steady_max
    assert "warm-up" in page.locator(".chart .legend").inner_text()
    tile = page.locator(".card", has_text="End-to-end p50 / p99")
    assert "6 checkpoints after warm-up" in tile.inner_text()
    p99 = tile.locator(".card-value").inner_text().split(" / ")[1]
    assert p99 != f"{warm_duration / 1000:.2f} s"


def test_the_graph_shows_records_per_second_and_backpressure_live(page, seeded):
    page.goto(f"{seeded.url}/#/jobs/{seeded.orders}")
    page.locator("svg.graph").wait_for()
    _report_live(seeded.url, seeded.orders, LIVE)
    source = page.locator("g[data-vertex='source']")
    page.wait_for_function("document.querySelector(\"[data-live='source']\").textContent.includes('82%')")
    assert "4,000/s" in source.text_content() and "backpressure 82%" in source.text_content()
    assert "bp-high" in source.get_attribute("class")
    assert "bp-ok" in page.locator("g[data-vertex='count']").get_attribute("class")
    _report_live(seeded.url, seeded.orders, {("source", 0): (2000.0, 0.3), ("source", 1): (2000.0, 0.2)})
    page.wait_for_function("document.querySelector(\"[data-live='source']\").textContent.includes('30%')")
    assert "bp-low" in source.get_attribute("class")


def test_the_job_page_shows_each_vertexs_low_watermark_and_each_subtasks_watermark_and_lag(page, seeded):
    page.goto(f"{seeded.url}/#/jobs/{seeded.orders}")
    page.locator("svg.graph").wait_for()
    _report_live(seeded.url, seeded.orders, LIVE, LAGS)
    page.wait_for_function("document.querySelector(\"[data-watermark='count']\")?.textContent.includes('lag 900 ms')")
    # the lowest watermark of the vertex's subtasks, with its lag; the idle count[0] is left out
    source = page.locator("[data-watermark='source']").text_content()
    assert re.match(r"watermark \d\d:\d\d:\d\d\.\d{3} · lag 1\.5 s", source), source
    assert page.locator("[data-watermark='sink']").text_content().startswith("watermark –")

    row = page.locator("tr[data-subtask='source[1]']")
    assert re.fullmatch(r"\d\d:\d\d:\d\d\.\d{3}", row.locator("td.watermark").inner_text()), row.inner_text()
    assert row.locator("td.lag").inner_text() == "1.2 s"
    idle = page.locator("tr[data-subtask='count[0]']")
    assert "(idle)" in idle.locator("td.watermark").inner_text() and idle.locator("td.lag").inner_text() == "1 min 0 s"
    sink = page.locator("tr[data-subtask='sink[0]']")
    assert (sink.locator("td.watermark").inner_text(), sink.locator("td.lag").inner_text()) == ("–", "–")
    # the rates are averages over the span the subtasks reported (bursts under backpressure), and say so
    assert page.locator("table.live-subtasks th.rate-span").inner_text() == "Records/s (avg 5 s)"


def test_the_job_page_shows_each_source_splits_position_and_lag(page, seeded):
    page.goto(f"{seeded.url}/#/jobs/{seeded.orders}")
    page.locator("svg.graph").wait_for()
    splits = {
        ("source", 0): {"splits": [{"split": "orders-0", "position": "1200", "lag": 34567}], "splits_more": 12},
        ("source", 1): {"splits": [{"split": "orders-1", "position": None, "lag": None}]},
    }
    _report_live(seeded.url, seeded.orders, LIVE, splits=splits)
    page.locator("table.source-splits tr[data-split='orders-1']").wait_for()
    cells = page.locator("tr[data-split='orders-0'] td").all_inner_texts()
    assert cells == ["orders-0", "source[0]", "1200", "34,567"]
    assert page.locator("tr[data-split='orders-1'] td").all_inner_texts() == ["orders-1", "source[1]", "–", "–"]
    assert "source[0]: and 12 more splits" in page.locator(".splits-more").inner_text()
    assert page.locator("table.source-splits tbody tr").count() == 2  # the other vertices have no splits


def test_an_adaptive_checkpoint_says_what_the_policy_chose_and_why(page, seeded):
    s = Seeder(seeded.url)
    try:
        job = s.job("adaptive-orders", policy="adaptive", alignment_timeout=300)
        s.attempt(job["id"])
        _report_live(seeded.url, job["id"], {("source", 0): (2000.0, 0.9)})
        cp = s.trigger(job["id"])
    finally:
        s.close()
    page.goto(f"{seeded.url}/#/jobs/{job['id']}/checkpoints/{cp}")
    decision = page.locator("dl.facts .decision")
    decision.wait_for()
    assert "chosen by adaptive: backpressure 0.90" in decision.inner_text()
    assert "unaligned" in page.locator("dl.facts").inner_text()
    # its type is what the coordinator decided, before any subtask acked
    assert page.locator("h1 .badge.type-unaligned").count() == 1
    assert page.locator("h1 .subtask-modes").inner_text() == "no subtask acknowledged"
    # the history table says what the adaptive policy chose for each checkpoint
    page.goto(f"{seeded.url}/#/jobs/{job['id']}")
    note = page.locator(f"tr[data-checkpoint='{cp}'] .decision-note")
    note.wait_for()
    assert note.inner_text().startswith("adaptive chose unaligned: backpressure 0.90")
    assert page.locator(".adaptive-count").inner_text() == (
        "The adaptive policy decided 1 of these 1 checkpoints: 1 unaligned.")
    page.goto(f"{seeded.url}/#/jobs/{job['id']}")
    page.locator(".config").wait_for()
    assert "adaptive (chooses per checkpoint; alignment budget 300 ms)" in page.locator(".config").inner_text()


def test_relayed_acks_keep_their_own_times_so_the_slowest_subtask_lights_up(page, seeded):
    """A host's relay sends its subtasks' acks in one request: each keeps its own ack time, so the timeline, the
    per-vertex min/avg/max and the slowest subtask are true; the header says what the subtasks did beside the type."""
    s = Seeder(seeded.url)
    try:
        job = s.job("relayed-orders", policy="unaligned", alignment_timeout=None)
        s.attempt(job["id"])
        cp = s.trigger(job["id"])
    finally:
        s.close()
    trigger = _api(seeded.url, f"/api/v1/jobs/{job['id']}/checkpoints/{cp}")["trigger_timestamp"]
    time.sleep(0.5)  # the slowed subtask's ack time must lie before the batch arrives
    acks = []
    for v in GRAPH["vertices"]:
        for i in range(v["parallelism"]):
            slowed = (v["id"], i) == ("count", 1)
            acks.append({"attempt": 1, "vertex": v["id"], "subtask_index": i, "metrics": {
                "ack_timestamp": trigger + (400 if slowed else 20 + 5 * i), "start_delay": 1700 if slowed else 3,
                "unaligned": not slowed, "aligned_over_budget": slowed}})
    _post(seeded.url, f"/api/v1/jobs/{job['id']}/checkpoints/{cp}/acks/batch", {"acks": acks})
    page.goto(f"{seeded.url}/#/jobs/{job['id']}/checkpoints/{cp}")
    page.locator("table.subtasks").wait_for()
    assert [r.get_attribute("data-subtask") for r in page.locator("tr.row-slow").all()] == ["count[1]"]
    assert "aligned (over the in-flight budget)" in page.locator("tr[data-subtask='count[1]'] td.took").inner_text()
    e2e = [page.locator(f"table.vertex-summary tr[data-vertex='count'][data-stat='{stat}'] td.num").nth(0)
           .inner_text() for stat in ("min", "avg", "max")]
    assert len(set(e2e)) == 3, e2e
    assert page.locator("h1 .badge.type-unaligned").count() == 1
    assert page.locator("h1 .subtask-modes").inner_text() == "5 unaligned · 1 aligned over the in-flight budget"
    dots = {c.get_attribute("cx") for c in page.locator(".timeline circle.ack-dot").all()}
    assert len(dots) > 1
    # the aligned subtask's wait was its start delay, shown where alignment is
    assert page.locator("dd.start-delay").inner_text().startswith("1.70 s")
    page.goto(f"{seeded.url}/#/jobs/{job['id']}")
    assert page.locator(f"tr[data-checkpoint='{cp}'] td.start-delay").inner_text() == "1.70 s"


OVERFLOWING = """() => {
  const out = [];
  if (document.documentElement.scrollWidth > window.innerWidth + 1) out.push("the page scrolls sideways");
  for (const p of document.querySelectorAll(".panel")) {
    const clipped = ["auto", "scroll", "hidden"].includes(getComputedStyle(p).overflowX);
    if (p.scrollWidth > p.clientWidth + 1 && !clipped) out.push(p.querySelector("h2,h3,caption")?.innerText || p.className);
  }
  return out;
}"""


@pytest.mark.parametrize("width", [1000, 760])
def test_at_narrow_widths_tables_stay_inside_their_panels(browser, seeded, width):
    """Below about 1,200 px the job and checkpoint tables ran over their panels' edges: a wide table now scrolls
    inside its panel, and the page itself never scrolls sideways."""
    context = browser.new_context(viewport={"width": width, "height": 900})
    context.set_default_timeout(TIMEOUT)
    page = context.new_page()
    try:
        page.goto(f"{seeded.url}/#/jobs/{seeded.orders}")
        page.locator("table.data").first.wait_for()
        assert page.evaluate(OVERFLOWING) == []
        page.goto(f"{seeded.url}/#/jobs/{seeded.orders}/checkpoints/{seeded.completed[-1]}")
        page.locator("table.data").first.wait_for()
        assert page.evaluate(OVERFLOWING) == []
    finally:
        page.screenshot(path=str(ARTIFACTS / f"narrow-{width}.png"), full_page=True)
        context.close()


def test_the_in_flight_page_and_the_checkpoint_page_state_the_same_in_flight_size(page, seeded):
    """The checkpoint counts the buffers' bytes; its segments also store each buffer's 4-byte length: the in-flight
    page said 111 KiB where the checkpoint said 110 KiB. Both now lead with the buffers' bytes."""
    cp = seeded.unaligned_checkpoint
    page.goto(f"{seeded.url}/#/jobs/{seeded.orders}/checkpoints/{cp}")
    button = page.get_by_text("In-flight data (").first
    button.wait_for()
    on_checkpoint = button.inner_text().split("(", 1)[1].split(")", 1)[0]
    page.goto(f"{seeded.url}/#/jobs/{seeded.orders}/checkpoints/{cp}/in-flight")
    page.locator(".inflight-payload").wait_for()
    assert page.locator(".inflight-payload").inner_text() == on_checkpoint
    manifest = _api(seeded.url, f"/api/v1/jobs/{seeded.orders}/checkpoints/{cp}/channel-state")
    stored = sum(g["length"] for e in manifest["entries"] for g in e["segments"])
    buffers = sum(g["buffer_count"] for e in manifest["entries"] for g in e["segments"])
    detail = _api(seeded.url, f"/api/v1/jobs/{seeded.orders}/checkpoints/{cp}")
    assert detail["persisted_data"] == stored - 4 * buffers, "the seeded checkpoint's figures disagree"
