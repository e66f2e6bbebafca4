"""What the Kafka source hands the pipeline: a Kafka record with its key and value deserialized (or, in the batch
form, a partition's records as one Arrow record batch), the deserializers, and the split ids of topic partitions
(``"<topic>-<partition>"``)."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

DESERIALIZERS = ("bytes", "str", "json")


@dataclass(frozen=True, slots=True)
class KafkaRecord:
    """One Kafka record as the pipeline sees it (key and value deserialized). ``timestamp`` is the record's Kafka
    timestamp in epoch ms (None when it has none): a natural event time for a ``WatermarkStrategy``."""

    topic: str
    partition: int
    offset: int
    key: Any
    value: Any
    headers: tuple[tuple[str, bytes | None], ...]
    timestamp: int | None


def deserializer(spec: str | Callable[[bytes | None], Any], what: str) -> Callable[[bytes | None], Any]:
    """``"bytes"`` (as they are), ``"str"`` (UTF-8), ``"json"``, or a function of the bytes; None stays None."""
    if callable(spec):
        return spec
    if spec == "bytes":
        return _as_bytes
    if spec == "str":
        return _as_str
    if spec == "json":
        return _as_json
    raise ValueError(f"KafkaSource {what} {spec!r} is not one of {', '.join(DESERIALIZERS)} or a function of bytes")


def _as_bytes(b: bytes | None) -> bytes | None:
    return b


def _as_str(b: bytes | None) -> str | None:
    return None if b is None else b.decode()


def _as_json(b: bytes | None) -> Any:
    return None if b is None else json.loads(b)


def split_id(topic: str, partition: int) -> str:
    return f"{topic}-{partition}"


def parse_split(split: str) -> tuple[str, int]:
    topic, _, partition = split.rpartition("-")
    return topic, int(partition)


KAFKA_COLUMNS = ("key", "topic", "partition", "offset", "timestamp", "headers")
"""The columns of a batch (``KafkaSource(batches=True)``) that come from Kafka, not from the value."""


def arrow_type(spec: str | Callable[[bytes | None], Any]) -> Any:
    """The Arrow type of what a named deserializer gives (None: inferred from the values)."""
    import pyarrow as pa

    return {"bytes": pa.binary(), "str": pa.string()}.get(spec) if isinstance(spec, str) else None


def record_batch(records: list[KafkaRecord], *, key_type: Any = None, value_type: Any = None,
                 value_columns: bool = False, value_schema: Any = None, include_headers: bool = False) -> Any:
    """``records`` (of one partition, in offset order) as one ``pyarrow.RecordBatch``: with ``value_columns`` the
    top-level fields of the values (dicts; None is a row of nulls) as columns (``value_schema``'s, or inferred),
    else a ``value`` column; then ``key``, ``topic``, ``partition``, ``offset``, ``timestamp`` (epoch ms) and, with
    ``include_headers``, ``headers`` (a list of ``{key, value}`` per row, as Spark's Kafka source gives them)."""
    import pyarrow as pa

    columns: dict[str, Any] = {}
    if value_columns:
        bad = next((r for r in records if r.value is not None and not isinstance(r.value, dict)), None)
        if bad is not None:
            raise ValueError(
                f"value_columns=True takes values that are objects (dicts), but the value at offset {bad.offset} of "
                f"{split_id(bad.topic, bad.partition)} is {type(bad.value).__name__} {bad.value!r:.100}; read such "
                "values with value_columns=False (a value column)"
            )
        fields = pa.RecordBatch.from_pylist([r.value or {} for r in records], schema=value_schema)
        clash = [name for name in fields.schema.names if name in KAFKA_COLUMNS]
        if clash:
            raise ValueError(
                f"the values have a field {clash[0]!r}, the name of a Kafka column of the batch "
                f"({', '.join(KAFKA_COLUMNS)}): rename it in value_deserializer, or read the value as one column "
                "with value_columns=False"
            )
        columns.update(zip(fields.schema.names, fields.columns, strict=True))
    else:
        columns["value"] = pa.array([r.value for r in records], type=value_type)
    columns["key"] = pa.array([r.key for r in records], type=key_type)
    columns["topic"] = pa.array([r.topic for r in records], type=pa.string())
    columns["partition"] = pa.array([r.partition for r in records], type=pa.int32())
    columns["offset"] = pa.array([r.offset for r in records], type=pa.int64())
    columns["timestamp"] = pa.array([r.timestamp for r in records], type=pa.int64())
    if include_headers:
        header = pa.struct([("key", pa.string()), ("value", pa.binary())])
        columns["headers"] = pa.array([[{"key": k, "value": v} for k, v in r.headers] for r in records],
                                      type=pa.list_(header))
    return pa.RecordBatch.from_pydict(columns)
