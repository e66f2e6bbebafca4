"""Killed subtask processes with concurrent unaligned checkpoints (``max_concurrent=2``, a 50 ms interval): under
backpressure checkpoints overlap now and then (one run: 13 of 219 completed checkpoints began before the previous
one completed); SIGKILLs land at random and the file sink still ends up with exactly the right per-key results, in
order.

``OVERTAKE_FAILURE_KILLS`` sets the kills (default 5).
"""

from __future__ import annotations

import pytest

from spark_plugin.connectors import FileSink
from tests.recovery.pipelines import check_exactly_once
from tests.recovery.test_subtask_failures import COUNT, checkpoint_config, file_rows, run_with_kills

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def test_killed_subtasks_with_two_concurrent_unaligned_checkpoints_leave_file_output_exactly_once(
    spark, coordinator, tmp_path
):
    out = tmp_path / "out"
    config = checkpoint_config("unaligned").model_copy(update={"interval": 50, "max_concurrent": 2})
    result = run_with_kills(
        spark, coordinator, "kill-concurrent", "unaligned", FileSink(str(out)), tmp_path / "pids", 41, COUNT, config
    )
    assert any(r.restored is not None for r in result.restarts), "no restart restored a checkpoint"
    check_exactly_once(file_rows(out), COUNT)
    assert not list((out / ".pending").iterdir())
