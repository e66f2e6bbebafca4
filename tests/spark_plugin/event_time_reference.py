"""The reference for windowed aggregates: Spark SQL's own ``groupBy(window(...))`` (or ``session_window``) over the
same input as a batch DataFrame, as ``(key, start_ms, end_ms, count, sum_of_n)`` rows sorted."""

from __future__ import annotations

from typing import Any

SCHEMA = "key long, ts long, q long, n long"


def spark_sql_windows(spark: Any, records: list[tuple], *, size_ms: int | None = None, slide_ms: int | None = None,
                      gap_ms: int | None = None) -> list[tuple]:
    """Count and sum ``n`` per key and window of the ``(key, ts, q, n)`` records: tumbling (``size_ms``), sliding
    (``size_ms``, ``slide_ms``) or session (``gap_ms``) windows on the event time ``ts`` (epoch ms)."""
    from pyspark.sql import functions as F

    df = spark.createDataFrame(records, SCHEMA).withColumn("t", F.timestamp_millis("ts"))
    if gap_ms is not None:
        window = F.session_window("t", f"{gap_ms} milliseconds").alias("w")
    elif slide_ms is not None:
        window = F.window("t", f"{size_ms} milliseconds", f"{slide_ms} milliseconds").alias("w")
    else:
        window = F.window("t", f"{size_ms} milliseconds").alias("w")
    rows = (
        df.groupBy(window, "key")
        .agg(F.count("*").alias("c"), F.sum("n").alias("s"))
        .select("key", F.unix_millis("w.start").alias("start"), F.unix_millis("w.end").alias("end"), "c", "s")
        .collect()
    )
    return sorted((r.key, r.start, r.end, r.c, r.s) for r in rows)


def flat(results: list) -> list[tuple]:
    """The pipeline's window results ``(key, start, end, (count, sum))`` in the reference's shape, sorted."""
    return sorted((int(k), int(s), int(e), int(c), int(total)) for k, s, e, (c, total) in results)


def zero() -> tuple[int, int]:
    return (0, 0)


def count_and_sum(acc: tuple[int, int], record: tuple) -> tuple[int, int]:
    return (acc[0] + 1, acc[1] + record[3])


def merge(a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int]:
    return (a[0] + b[0], a[1] + b[1])
