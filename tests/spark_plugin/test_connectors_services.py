"""Connectors against the real services: the PostgreSQL sink commits exactly once across a restore; the Redis
Streams source reads its streams and resumes after its entry ids."""

from __future__ import annotations

import time
import uuid

import pytest

from contract.events import JobStatusChanged
from spark_plugin import Pipeline
from spark_plugin.connectors import CollectSink, SequenceSource
from spark_plugin.connectors.postgres import PostgresSink
from spark_plugin.connectors.redis_streams import RedisStreamSource
from spark_plugin.network.config import NetworkConfig
from spark_plugin.testing.threads import ThreadedRun
from tests.spark_plugin.fakes import InMemoryCoordinator
from tests.spark_plugin.test_restore_threads import plan_from_acks
from tests.spark_plugin.test_subtask_threads import wait_for


def slow(key, record, state):
    time.sleep(0.0002)
    return [record]


def pg_pipeline(dsn: str, count: int) -> Pipeline:
    p = Pipeline("pg", parallelism=2)
    (
        p.source(SequenceSource(count=count, keys=9), id="src")
        .key_by(lambda r: r[0])
        .process(slow, id="slow")
        .sink(PostgresSink(dsn, "results", ["k", "seq"]), id="out")
    )
    return p


@pytest.mark.postgres
def test_postgres_sink_is_exactly_once_across_a_restore(pg_url):
    import psycopg

    dsn = pg_url.replace("postgresql+asyncpg://", "postgresql://", 1)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE results (k int, seq int)")
    count = 5000
    net = NetworkConfig(buffer_size=512)
    first_coord = InMemoryCoordinator(expected_subtasks=4)
    first = ThreadedRun(pg_pipeline(dsn, count), first_coord.reporter, first_coord.events, net).start()
    wait_for(lambda: first.subtask("slow", 0).records_in > 500, "records to flow")
    first_coord.trigger(1, "unaligned")
    wait_for(lambda: 1 in first_coord.completed, "checkpoint 1")
    first_coord.publish(JobStatusChanged(status="CANCELLED"))
    first.join(60)

    def fetch(blob_id, start, end):
        data = first_coord.blobs[blob_id]
        return data if start is None else data[start : end + 1]

    second_coord = InMemoryCoordinator(expected_subtasks=4)
    second_coord.next_id = 2
    ThreadedRun(
        pg_pipeline(dsn, count), second_coord.reporter, second_coord.events, net,
        restore=plan_from_acks(first_coord.acks[1]), fetch=fetch, restore_checkpoint=1,
    ).start().join(120)
    with psycopg.connect(dsn) as conn:
        seqs = [r[0] for r in conn.execute("SELECT seq FROM results ORDER BY seq")]
        markers = conn.execute("SELECT count(*) FROM overtake_sink_commits").fetchone()[0]
    assert seqs == list(range(count)), f"{len(seqs) - len(set(seqs))} duplicates, {count - len(set(seqs))} missing"
    assert markers >= 2


@pytest.mark.redis
def test_redis_streams_source_reads_every_entry_and_resumes_after_its_ids(redis_url):
    import redis

    r = redis.Redis.from_url(redis_url, decode_responses=True)
    tag = uuid.uuid4().hex[:8]  # one prefix: stream i goes to subtask (start + i) % 2, so each subtask owns one
    streams = [f"overtake-test-{tag}-{i}" for i in range(3)]
    try:
        for i, s in enumerate(streams):
            for n in range(200):
                r.xadd(s, {"n": str(n), "stream": str(i)})
        src = RedisStreamSource(redis_url, streams, stop_at_end=True)
        src.open(0, 2)
        mine = src.partitions()  # the streams the runtime gave subtask 0 of 2
        assert mine and all(r.xlen(s) == 200 for s in mine), {s: r.xlen(s) for s in streams}
        first = []
        for _ in range(2):
            got = src.poll(150)
            assert got is not None, (
                f"the source ended after {len(first)} entries of {mine}: "
                f"{ {s: r.xlen(s) for s in mine} } in Redis, positions {src.offsets()}"
            )
            first += got
        again = RedisStreamSource(redis_url, streams, stop_at_end=True)
        again.open(0, 2)
        again.seek(src.offsets())
        rest = []
        while (got := again.poll(64)) is not None:
            rest += got
        entries = first + rest
        assert len(entries) == 200 * len(mine) and len({(s, i) for s, i, _ in entries}) == len(entries)
        assert {s for s, _, _ in entries} == set(mine)

        p = Pipeline("redis", parallelism=2)
        p.source(RedisStreamSource(redis_url, streams, stop_at_end=True), id="src").map(
            lambda e: (e[0], int(e[2]["n"])), id="parse"
        ).sink(CollectSink(), id="out")
        coord = InMemoryCoordinator()
        results = ThreadedRun(p, coord.reporter, coord.events).start().join(60)
        got = sorted(x for res in results for x in res.outputs["out"]["records"])
        assert got == sorted((s, n) for s in streams for n in range(200))
    finally:
        r.delete(*streams)
        r.close()
