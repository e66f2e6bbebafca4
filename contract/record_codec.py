"""How one record of a buffer is encoded: a pickle, or an Arrow IPC stream for the records of batch streams.

A buffer is framed records (:mod:`contract.channel_state`); each record's bytes are either

- a **pickle** (protocol 5, so they begin with ``0x80``): every record of a record stream, or
- an **Arrow IPC stream** (they begin with the IPC continuation marker ``ff ff ff ff``): the schema, one record batch
  and the end-of-stream marker, which ``pyarrow.ipc.open_stream`` and DuckDB's Arrow reader open as they are, or
- a **batch without its schema** (it begins with ``0x01``, :data:`SHARED_SCHEMA`): the same stream with its schema
  message left out, because the last whole Arrow record before it in its buffer has the same schema (the same
  bytes); that record's schema message followed by these bytes after the ``0x01`` is the whole stream
  (:func:`with_schema`).

Batch streams' records travel and are persisted as Arrow: a ``pyarrow.RecordBatch`` as itself, and a
:class:`SubtaskBatch` (a batch keyed by ``key_by("column")``) as its batch, with the key column's name in the schema's
metadata under ``overtake.key_column``; its ``key`` is the first row's value in that column, which is how
``key_by`` and the hash edge build it. A :class:`SubtaskBatch` whose key is not its first row's (none are, but a
hand-built one could be), and the older :class:`KeyedBatch`, stay pickles. Checkpoints taken before batches travelled
as Arrow hold pickled batches: a reader tells the two apart by the first byte, so they restore as before.

The schema goes with the first batch of each schema in a buffer (a few hundred bytes: 17 % of a 50-row batch of
three columns, 0.2 % of 8,192 rows), so a buffer reads alone, from its start, by a restore or a preview; the rest of
a partly read buffer is given its schema again where it needs it (``spark_plugin.network.framing``). pyarrow is
imported only when an Arrow record is encoded or decoded: the record path never imports it.
"""

from __future__ import annotations

import pickle
from typing import Any, NamedTuple

ARROW_PREFIX = b"\xff\xff\xff\xff"
"""The first bytes of an Arrow-encoded record (the IPC continuation marker); a pickle begins with 0x80."""
ARROW_FIRST_BYTE = 0xFF
SHARED_SCHEMA = 0x01
"""The first byte of a batch written without its schema: the rest is an Arrow IPC stream whose schema message was
left out, the schema being that of the last whole Arrow record before it in its buffer (:func:`with_schema`)."""
KEY_COLUMN = b"overtake.key_column"
PROTOCOL = 5


class KeyedBatch(NamedTuple):
    """The rows of one batch whose keys fall into key group ``group``, in their order; ``key`` is one of them (the
    edge routes by it). The shape of a keyed batch before :class:`SubtaskBatch`: checkpoints taken then hold it."""

    key: Any
    group: int
    batch: Any


class SubtaskBatch(NamedTuple):
    """Rows of a batch keyed by ``column``: out of ``key_by`` a whole batch, after the hash edge the rows bound for
    one subtask (those of every key group it owns, rows of a key in their order); ``key`` is the first row's."""

    key: Any
    column: str
    batch: Any


_dumps = pickle.dumps
_loads = pickle.loads
_ARROW_TYPES: set[type] = {SubtaskBatch}  # types that may encode as Arrow (pyarrow.RecordBatch joins when seen)
_PICKLED_TYPES: set[type] = set()  # types seen that never do


def _is_record_batch_type(t: type) -> bool:
    return t.__name__ == "RecordBatch" and t.__module__ == "pyarrow.lib"


def encode(record: Any) -> bytes:
    """The bytes of one record: Arrow IPC for a batch, a pickle for anything else."""
    t = type(record)
    if t in _PICKLED_TYPES:
        return _dumps(record, PROTOCOL)
    if t not in _ARROW_TYPES:
        if not _is_record_batch_type(t):
            _PICKLED_TYPES.add(t)
            return _dumps(record, PROTOCOL)
        _ARROW_TYPES.add(t)
    if t is SubtaskBatch:
        return _encode_subtask_batch(record)
    return _ipc(record, None)


def decode(data: bytes | memoryview) -> Any:
    """One record from its bytes (as :func:`encode` wrote them, or as an older version pickled them)."""
    if len(data) and data[0] == ARROW_FIRST_BYTE:
        return decode_arrow(data)
    if len(data) and data[0] == SHARED_SCHEMA:
        raise ValueError("a batch written without its schema: read it with its buffer, whose last whole Arrow "
                         "record before it holds the schema (contract.record_codec.with_schema)")
    return _loads(data)


def schema_length(data: bytes | memoryview) -> int:
    """The length of the schema message a whole Arrow record begins with; 0 when ``data`` is not one (a pickle, a
    batch without its schema) or is too short to hold the message it announces."""
    if len(data) < 8 or data[0] != ARROW_FIRST_BYTE or bytes(data[:4]) != ARROW_PREFIX:
        return 0
    n = 8 + int.from_bytes(bytes(data[4:8]), "little")
    return n if n < len(data) else 0


def with_schema(schema: bytes | memoryview, record: bytes | memoryview) -> bytes:
    """The whole Arrow record (an IPC stream that ``pyarrow.ipc.open_stream`` opens) of a batch written without its
    schema (first byte :data:`SHARED_SCHEMA`), given the schema message of the whole record before it."""
    return b"".join((schema, record[1:]))


def is_arrow(data: bytes | memoryview) -> bool:
    return bytes(data[:4]) == ARROW_PREFIX


def decode_arrow(data: bytes | memoryview) -> Any:
    """The record of an Arrow-encoded record's bytes: a ``pyarrow.RecordBatch``, or a :class:`SubtaskBatch` when the
    schema names a key column. Raises ``ValueError`` when they are not one Arrow IPC stream of one batch."""
    return _record_of(read_batch(data))


def _record_of(batch: Any) -> Any:
    column = (batch.schema.metadata or {}).get(KEY_COLUMN)
    if column is None:
        return batch
    name = column.decode()
    batch = batch.replace_schema_metadata(_without_key_column(batch.schema.metadata))
    return SubtaskBatch(batch.column(name)[0].as_py(), name, batch)


def read_schema(schema: bytes | memoryview) -> Any:
    """The ``pyarrow.Schema`` of a whole Arrow record's schema message (its first :func:`schema_length` bytes)."""
    import pyarrow as pa

    return pa.ipc.read_schema(pa.py_buffer(schema))


def decode_without_schema(record: bytes | memoryview, schema: Any, schema_message: bytes | memoryview) -> Any:
    """The record of a batch written without its schema (``record`` from its ``0x01`` on), given its buffer's schema
    (:func:`read_schema` of ``schema_message``): its batch message is read against the schema already parsed; a
    stream holding more than the one batch message (dictionaries) is read whole (:func:`with_schema`)."""
    import pyarrow as pa

    view = memoryview(record)[1:]
    try:
        message = pa.ipc.read_message(pa.py_buffer(view))
    except (pa.ArrowInvalid, OSError) as e:
        raise ValueError(f"not an Arrow batch without its schema: {e}") from None
    if message.type != "record batch":
        return decode_arrow(with_schema(schema_message, record))
    return _record_of(pa.ipc.read_record_batch(message, schema))


def read_batch(data: bytes | memoryview) -> Any:
    """The one record batch of an Arrow IPC stream, its schema metadata as written (``overtake.key_column`` kept);
    ``ValueError`` when the bytes hold no batch or more than one."""
    import pyarrow as pa

    try:
        reader = pa.ipc.open_stream(pa.py_buffer(data))
        batch = reader.read_next_batch()
    except (pa.ArrowInvalid, StopIteration) as e:
        raise ValueError(f"not an Arrow IPC stream of one record batch: {e or 'no batch'}") from None
    try:
        reader.read_next_batch()
    except StopIteration:
        return batch
    raise ValueError("an Arrow-encoded record holds more than one record batch")


def _encode_subtask_batch(record: SubtaskBatch) -> bytes:
    batch = record.batch
    if not _is_record_batch_type(type(batch)) or not batch.num_rows or record.column not in batch.schema.names:
        return _dumps(record, PROTOCOL)
    first = batch.column(record.column)[0].as_py()
    if type(first) is not type(record.key) or first != record.key:
        return _dumps(record, PROTOCOL)  # a hand-built one: its key would not survive the round trip
    return _ipc(batch, record.column)


def rows_of(record: Any) -> int:
    """The rows of a batch record (a ``pyarrow.RecordBatch`` or a :class:`SubtaskBatch` of one); 0 for any other."""
    if type(record) is SubtaskBatch:
        record = record.batch
    return record.num_rows if _is_record_batch_type(type(record)) else 0


def slice_rows(record: Any, offset: int, length: int) -> Any:
    """Rows ``offset`` to ``offset + length`` of a batch record, as the same kind of record: a zero-copy slice of a
    ``pyarrow.RecordBatch``, or a :class:`SubtaskBatch` of one whose key is the slice's first row's (which is what
    lets it travel as Arrow). Arrow's IPC writer writes only the slice's rows."""
    if type(record) is SubtaskBatch:
        part = record.batch.slice(offset, length)
        return SubtaskBatch(part.column(record.column)[0].as_py(), record.column, part)
    return record.slice(offset, length)


def _ipc(batch: Any, key_column: str | None) -> bytes:
    import pyarrow as pa

    if key_column is not None:
        metadata = dict(batch.schema.metadata or {})
        metadata[KEY_COLUMN] = key_column.encode()
        batch = batch.replace_schema_metadata(metadata)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return sink.getvalue().to_pybytes()


def _without_key_column(metadata: dict[bytes, bytes] | None) -> dict[bytes, bytes] | None:
    rest = {k: v for k, v in (metadata or {}).items() if k != KEY_COLUMN}
    return rest or None
