"""The ack-path benchmark (``benchmarks/ackpath.py``) against a live coordinator: its subtasks, processes of their
own, write and ack every round of every path, each checkpoint completes, and the relay sends its rounds' acks
together. No timing is asserted."""

from __future__ import annotations

from benchmarks.ackpath import measure
from client.sync import OvertakeClient


def test_every_round_of_every_path_completes_its_checkpoint(coordinator):
    st = measure(coordinator.url, 2, 2, 64 * 1024, pause=0.0)
    assert len(st.direct_ms) == len(st.relay_ms) == len(st.all_acked_ms) == 2
    assert len(st.write_ms) == 8  # 2 subtasks x 2 rounds x (direct, relay)
    assert len(st.relay_control_ms) == len(st.relay_write_span_ms) == 2
    # one batch per round when both acks reach the relay within its linger; a loaded machine may split a round
    assert 2 <= st.relay_requests <= 4
    assert st.commit_floor_ms == [] and st.floor_p50 is None  # SQLite: no PostgreSQL commit to time
    with OvertakeClient(coordinator.url) as admin:
        job = max((j for j in admin.list_jobs(limit=200).items if j.name.startswith("ack-path-2-")), key=lambda j: j.id)
        statuses = [c.status.value for c in admin.list_checkpoints(job.id).items]
    assert statuses.count("COMPLETED") == 6, statuses
