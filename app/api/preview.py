"""The preview of channel-state records for the UI: records from subtasks, treated as untrusted.

A segment is framed buffers and a buffer is framed records (``contract.channel_state``); the buffers of a
compressed segment are inflated first, each to a bounded size. A record is a pickle or, on a batch edge, an Arrow
IPC stream of one record batch (``contract.record_codec``). Pickles are unpickled by :class:`SafeUnpickler`, which
resolves only a tiny allow-list of harmless classes; anything else is shown as hex and marked unsupported. Arrow
records are read with pyarrow's IPC reader, which runs no code from the data, and only their first rows are
validated and shown. Records decoded, the size of a record decoded, the rows shown and the length of each rendering
are all bounded.
"""

from __future__ import annotations

import datetime
import decimal
import io
import pickle
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from contract.channel_state import FRAME, spans, unpack
from contract.record_codec import KEY_COLUMN, is_arrow, read_batch, schema_length, with_schema

MAX_RECORD_BYTES = 64 * 1024
MAX_INFLATED_BYTES = 64 * 1024 * 1024
"""The most bytes one buffer of a compressed segment may inflate to in a preview (a buffer is at most the
runtime's buffer size, or one Arrow batch on a batch edge)."""
MAX_ARROW_RECORD_BYTES = MAX_INFLATED_BYTES
"""An Arrow record is read without copying and only its first rows are decoded, so it may be as large as a buffer."""
ARROW_ROWS = 20
TEXT_LIMIT = 2000
HEX_LIMIT = 64


class RecordPreview(BaseModel):
    model_config = ConfigDict(extra="forbid")

    index: int = Field(description="Position of the record in the segment (0-based).")
    buffer: int = Field(description="Position of its buffer in the segment (0-based).")
    size: int = Field(description="Size of the record's bytes (a pickle, or an Arrow IPC stream on a batch edge).")
    status: Literal["ok", "unsupported", "too_large", "error"]
    type: str | None = Field(default=None, description="Python type name of the decoded value.")
    text: str = Field(description="A bounded rendering of the value, or why it was not decoded.")
    hex: str | None = Field(
        default=None, description="The first bytes, in hex, when the record was not decoded."
    )


class SegmentPreview(BaseModel):
    model_config = ConfigDict(extra="forbid")

    job_id: int
    checkpoint_id: int
    vertex: str
    subtask_index: int
    channel: str
    direction: Literal["input", "output"]
    segment_length: int = Field(description="Bytes of the whole segment.")
    bytes_read: int = Field(description="Bytes of the segment read for this preview.")
    buffer_count: int
    record_count: int = Field(description="Records in the whole segment, as its subtask reported.")
    records: list[RecordPreview]
    truncated: bool = Field(description="More records follow than the preview shows.")


# --------------------------------------------------------------------------- safe decoding


def _bytearray(*args: Any) -> bytearray:
    if not args or not isinstance(args[0], (bytes, str)):  # bytearray(10**12) would allocate, refuse sizes
        raise pickle.UnpicklingError("bytearray is only rebuilt from bytes")
    return bytearray(*args[:2]) if isinstance(args[0], str) else bytearray(args[0])


_ALLOWED: dict[tuple[str, str], Any] = {
    ("builtins", "set"): set,
    ("builtins", "frozenset"): frozenset,
    ("builtins", "bytearray"): _bytearray,
    ("builtins", "complex"): complex,
    ("datetime", "datetime"): datetime.datetime,
    ("datetime", "date"): datetime.date,
    ("datetime", "time"): datetime.time,
    ("datetime", "timedelta"): datetime.timedelta,
    ("datetime", "timezone"): datetime.timezone,
    ("decimal", "Decimal"): decimal.Decimal,
}


class Unsupported(Exception):
    """The record needs a class outside the allow-list."""


class SafeUnpickler(pickle.Unpickler):
    """Resolves only the allow-list; never imports or calls anything else."""

    def find_class(self, module: str, name: str) -> Any:
        allowed = _ALLOWED.get((module, name))
        if allowed is None:
            raise Unsupported(f"{module}.{name}")
        return allowed

    def persistent_load(self, pid: Any) -> Any:
        raise Unsupported("persistent id")


def safe_loads(data: bytes) -> Any:
    return SafeUnpickler(io.BytesIO(data)).load()


def render(value: Any, limit: int = TEXT_LIMIT) -> str:
    """A repr-like rendering cut at ``limit`` characters, safe on shared and cyclic structures."""
    out: list[str] = []
    used = [0]
    cut = [False]

    def put(s: str) -> bool:
        room = limit - used[0]
        if len(s) > room:
            out.append(s[:room])
            used[0] = limit
            cut[0] = True
            return False
        out.append(s)
        used[0] += len(s)
        return True

    def walk(v: Any, path: set[int], depth: int) -> bool:
        if depth > 50:
            return put("…")
        if isinstance(v, (list, tuple, set, frozenset, dict)):
            if id(v) in path:
                return put("<cycle>")
            path = path | {id(v)}
            if isinstance(v, dict):
                opening, closing = "{", "}"
            elif isinstance(v, list):
                opening, closing = "[", "]"
            elif isinstance(v, tuple):
                opening, closing = "(", ",)" if len(v) == 1 else ")"
            elif not v:
                return put(f"{type(v).__name__}()")
            else:
                opening, closing = ("{", "}") if type(v) is set else ("frozenset({", "})")
            if not put(opening):
                return False
            for i, item in enumerate(v.items() if isinstance(v, dict) else v):
                if i and not put(", "):
                    return False
                if isinstance(v, dict):
                    if not (walk(item[0], path, depth + 1) and put(": ") and walk(item[1], path, depth + 1)):
                        return False
                elif not walk(item, path, depth + 1):
                    return False
            return put(closing)
        if isinstance(v, (str, bytes, bytearray)):
            return put(repr(v[: limit - used[0] + 1]))
        try:
            text = repr(v)
        except ValueError:  # e.g. an int past the digit limit
            text = f"<{type(v).__name__}>"
        return put(text)

    walk(value, set(), 0)
    text = "".join(out)
    return text[: max(0, limit - 1)] + "…" if cut[0] else text


def preview_record(data: bytes, index: int, buffer: int) -> RecordPreview:
    base = {"index": index, "buffer": buffer, "size": len(data)}
    if is_arrow(data):
        return _preview_arrow(data, base)
    if len(data) > MAX_RECORD_BYTES:
        return RecordPreview(
            **base,
            status="too_large",
            text=f"record of {len(data)} bytes; the preview decodes records up to {MAX_RECORD_BYTES} bytes",
            hex=data[:HEX_LIMIT].hex(),
        )
    try:
        value = safe_loads(data)
    except Unsupported as exc:
        return RecordPreview(
            **base,
            status="unsupported",
            text=f"needs {exc}, which the preview does not load",
            hex=data[:HEX_LIMIT].hex(),
        )
    except Exception as exc:  # a corrupt or hostile pickle: show it, never fail the page
        return RecordPreview(
            **base,
            status="error",
            text=f"not a readable pickle ({type(exc).__name__})",
            hex=data[:HEX_LIMIT].hex(),
        )
    try:
        text = render(value)
    except RecursionError:
        text = "<too deeply nested>"
    return RecordPreview(**base, status="ok", type=type(value).__name__, text=text)


def _preview_arrow(data: bytes, base: dict[str, Any]) -> RecordPreview:
    """An Arrow record batch: its shape, schema and first ``ARROW_ROWS`` rows."""
    if len(data) > MAX_ARROW_RECORD_BYTES:
        return RecordPreview(
            **base, status="too_large", hex=data[:HEX_LIMIT].hex(),
            text=f"Arrow record batch of {len(data)} bytes; the preview reads batches up to {MAX_ARROW_RECORD_BYTES} "
                 "bytes",
        )
    try:
        import pyarrow  # noqa: F401 - optional on the coordinator
    except ImportError:
        return RecordPreview(
            **base, status="unsupported", hex=data[:HEX_LIMIT].hex(),
            text="an Arrow record batch; the preview reads it with pyarrow, which is not installed on the coordinator "
                 "(pip install 'overtake[arrow]')",
        )
    try:
        batch = read_batch(data)
        head = batch.slice(0, ARROW_ROWS)
        head.validate(full=True)  # offsets and lengths checked before any value is read
        rows = head.to_pylist()
    except Exception as exc:  # corrupt or hostile bytes: show them, never fail the page
        return RecordPreview(
            **base, status="error", hex=data[:HEX_LIMIT].hex(),
            text=f"not a readable Arrow record batch ({type(exc).__name__}: {str(exc)[:200]})",
        )
    key = (batch.schema.metadata or {}).get(KEY_COLUMN)
    fields = ", ".join(f"{f.name}: {f.type}" for f in batch.schema)
    head_text = f"{batch.num_rows} rows × {batch.num_columns} columns ({fields})"
    if key is not None:
        head_text += f", keyed by {key.decode(errors='replace')!r}"
    shown = f"first {len(rows)}" if len(rows) < batch.num_rows else "all"
    head_text += f"; {shown} rows: "
    try:
        text = head_text + render(rows, max(TEXT_LIMIT - len(head_text), 10))
    except RecursionError:
        text = head_text + "<too deeply nested>"
    return RecordPreview(
        **base, status="ok", type="SubtaskBatch" if key is not None else "RecordBatch", text=text[:TEXT_LIMIT]
    )


def decode_segment(
    data: bytes, complete: bool, max_records: int, codec: str | None = None
) -> tuple[list[RecordPreview], bool]:
    """Records of the leading bytes of a segment; the last buffer may be cut when ``complete`` is false.

    With ``codec`` (a compressed segment) each whole buffer is inflated first, to at most ``MAX_INFLATED_BYTES``;
    a cut-off compressed buffer cannot be inflated and is left out.

    Returns the previews and whether records were left out (by the record limit or the byte limit)."""
    if codec is not None:
        return _decode_compressed(data, complete, max_records, codec)
    records: list[RecordPreview] = []
    buffers, whole_end = spans(data)
    cut = whole_end != len(data)
    partial = None
    if len(data) - whole_end >= FRAME.size:  # the last buffer was cut off: its whole records are still shown
        partial = len(buffers)
        buffers.append((whole_end + FRAME.size, len(data)))
    for buffer, (start, end) in enumerate(buffers):
        if _decode_buffer(data, start, end, buffer, buffer == partial, records, max_records):
            return records, True
    return records, not complete or cut


def _decode_buffer(
    data: bytes, start: int, end: int, buffer: int, partial: bool, records: list[RecordPreview], max_records: int
) -> bool:
    """Append the records of one buffer (``data[start:end]``); True when the record limit was reached."""
    found, stop = spans(data, start, end)
    schema = None  # the schema message of the buffer's last whole Arrow record
    for rstart, rend in found:
        if len(records) >= max_records:
            return True
        record = data[rstart:rend]
        if record[:1] == b"\x01":  # a batch written without its schema: the last whole Arrow record's is its own
            if schema is None:
                records.append(RecordPreview(
                    index=len(records), buffer=buffer, size=len(record), status="error", hex=record[:HEX_LIMIT].hex(),
                    text="an Arrow batch written without its schema, after no Arrow record of its buffer that has one"))
                continue
            shown = preview_record(with_schema(schema, record), len(records), buffer)
            records.append(shown.model_copy(update={"size": len(record)}))  # its size as it travelled
            continue
        if is_arrow(record):
            n = schema_length(record)
            schema = record[:n] if n else None
        records.append(preview_record(record, len(records), buffer))
    if stop != end and not partial:
        records.append(
            RecordPreview(
                index=len(records),
                buffer=buffer,
                size=end - stop,
                status="error",
                text="the buffer's framing is broken here; the rest of the buffer is not shown",
                hex=data[stop : stop + HEX_LIMIT].hex(),
            )
        )
    return False


def _decode_compressed(data: bytes, complete: bool, max_records: int, codec: str) -> tuple[list[RecordPreview], bool]:
    records: list[RecordPreview] = []
    packed, whole_end = spans(data)
    for buffer, (start, end) in enumerate(packed):
        try:
            raw = unpack(codec, data[start:end], MAX_INFLATED_BYTES)
        except Exception as exc:  # corrupt, too large, or pyarrow missing: show it, never fail the page
            records.append(
                RecordPreview(
                    index=len(records), buffer=buffer, size=end - start, status="error",
                    text=f"the {codec} buffer does not inflate ({exc}); the rest of the segment is not shown",
                    hex=data[start : start + HEX_LIMIT].hex(),
                )
            )
            return records, True
        if _decode_buffer(raw, 0, len(raw), buffer, False, records, max_records):
            return records, True
    return records, not complete or whole_end != len(data)
