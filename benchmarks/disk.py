"""Scenario 4 of the FLIP-76 test plan: channel-state write bandwidth against raw sequential write bandwidth, on the
same directory, with the runtime's own buffers, channel-state writer and state writer."""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.flip76 import Settings
from spark_plugin.connectors import SequenceSource
from spark_plugin.network.config import NetworkConfig


@dataclass
class DiskStats:
    directory: str
    total_bytes: int
    blob_bytes: int
    buffer_bytes: int
    raw_mib_s: list[float] = field(default_factory=list)
    channel_state_mib_s: list[float] = field(default_factory=list)
    writer_only_mib_s: list[float] = field(default_factory=list)
    fsync_per_blob_ms: list[float] = field(default_factory=list)
    writers: int = 1
    """Subtasks writing at once, each a process of its own."""

    @property
    def raw(self) -> float:
        """The best of the raw repeats, not their mean: on a shared machine a repeat slowed by something else (one
        run here measured 316, 795 and 540 MiB/s) would flatter the channel state's ratio."""
        return max(self.raw_mib_s) if self.raw_mib_s else 0.0

    @property
    def channel_state(self) -> float:
        return statistics.mean(self.channel_state_mib_s) if self.channel_state_mib_s else 0.0

    @property
    def writer_only(self) -> float:
        return statistics.mean(self.writer_only_mib_s) if self.writer_only_mib_s else 0.0

    @property
    def ratio(self) -> float:
        return self.channel_state / self.raw if self.raw else 0.0

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(raw=self.raw, channel_state=self.channel_state, writer_only=self.writer_only, ratio=self.ratio)
        return d


def realistic_buffers(s: Settings, n: int = 16) -> list[tuple[bytes, int]]:
    """``n`` full network buffers of the benchmark's records, framed by the runtime's own BufferBuilder."""
    from spark_plugin.network.framing import BufferBuilder

    src = SequenceSource(keys=s.keys, skew=s.skew, payload=s.payload_bytes)
    src.open(0, 1)
    b = BufferBuilder(s.network().buffer_size)
    out: list[tuple[bytes, int]] = []
    while len(out) < n:
        for r in src.poll(64):
            if b.add(r):
                records = len(b)
                out.append((b.finish(), records))
                if len(out) == n:
                    break
    return out


def inflight_capacity_bytes(net: NetworkConfig, channels: int = 2) -> int:
    """What a subtask with ``channels`` inputs and outputs can persist in one checkpoint with this sizing (one
    blob): its input gate's buffers and, per output channel, its credit plus the backlog (the runtime's bound,
    ``NetworkConfig.inflight_capacity_bytes``)."""
    return net.inflight_capacity_bytes(inputs=channels, outputs=channels)


def raw_write(path: Path, total: int, chunk: int = 4 << 20) -> float:
    """Seconds to write ``total`` bytes sequentially in ``chunk``-sized writes, then fsync."""
    data = os.urandom(chunk)
    t0 = time.perf_counter()
    with open(path, "wb", buffering=0) as f:
        left = total
        while left > 0:
            n = min(chunk, left)
            f.write(data if n == chunk else data[:n])
            left -= n
        os.fsync(f.fileno())
    elapsed = time.perf_counter() - t0
    path.unlink()
    return elapsed


def _subtask_writes(directory: Path, k: int, share: int, per_blob: int, buffers: list[tuple[bytes, int]],
                    to_disk: bool, start: Any = None) -> tuple[float, float, int, list[float]]:
    """One subtask of :func:`channel_state_write`: checkpoints of about ``per_blob`` buffers each until it persisted
    its ``share``. Returns (started, ended, bytes written, seconds each blob took to be durable); ``start``: a
    barrier every subtask passes before its clock starts (the processes' start-up is not timed)."""
    from contract.models import WriteTarget
    from spark_plugin.plan.topology import ChannelInfo
    from spark_plugin.task.channel_state import ChannelStateWriter
    from spark_plugin.task.state_store import StateWriter

    infos = [ChannelInfo(f"in-{i}", "input", "upstream", i, "hash") for i in range(2)]
    infos += [ChannelInfo(f"out-{i}", "output", "downstream", i, "hash") for i in range(2)]
    writer = StateWriter(f"subtask-{k}.state")
    durable: list[float] = []
    written, cid = 0, 0
    if start is not None:
        start.wait()
    t0 = time.perf_counter()
    try:
        while written < share:
            cid += 1
            w = ChannelStateWriter()
            w.start(cid)
            for i in range(per_blob):
                data, records = buffers[i % len(buffers)]
                info = infos[i % len(infos)]
                if info.direction == "input":
                    w.add_input_data(cid, info, data)
                else:
                    w.add_output_data(cid, info, data, records)
            w.finish_input(cid)
            w.finish_output(cid)
            res = w.take(cid)
            if to_disk:
                f0 = time.perf_counter()
                writer.write(WriteTarget(prefix=f"job-1/cp-{cid:012d}/", url=directory.as_uri()), None, res.data)
                durable.append(time.perf_counter() - f0)
            written += len(res.data)
    finally:
        writer.close()
    return t0, time.perf_counter(), written, durable


def _subtask_process(args: tuple, start: Any, conn: Any) -> None:
    from benchmarks import processes

    try:
        conn.send(_subtask_writes(*args, start=start))
    except BaseException as exc:  # noqa: BLE001 - the measuring process raises it
        processes.failed(conn, f"writer {args[1]}", exc)
        raise


def channel_state_write(directory: Path, total: int, blob: int, buffers: list[tuple[bytes, int]],
                        to_disk: bool = True, writers: int = 1) -> tuple[float, float]:
    """Seconds to persist ``total`` bytes of channel state as blobs of about ``blob`` bytes by ``writers`` subtasks at
    once (each its share, as a checkpoint's subtasks write at the same time), and the mean time to make one blob
    durable.

    Each blob goes through the runtime's :class:`ChannelStateWriter` (2 input channels whose buffers are counted
    by the writer as the runtime's input side does, 2 output channels with known record counts), ``take()``
    lays it out, and the subtask's :class:`StateWriter` writes it under its checkpoint's prefix as a subtask does
    straight into a ``file://`` store (the object written in place and fsynced, then its directory). With
    ``to_disk=False`` only the channel-state writer runs.

    Several subtasks run as processes of their own (``benchmarks.processes``); the time runs from the moment all of
    them are started and waiting to the last one's end.
    """
    per_blob = max(1, blob // len(buffers[0][0]))
    share = total // writers
    if writers == 1:
        t0, t1, written, durable = _subtask_writes(directory, 0, share, per_blob, buffers, to_disk)
        runs = [(t0, t1, written, durable)]
    else:
        from benchmarks import processes

        ctx = processes.context()
        start = ctx.Barrier(writers, timeout=120)
        procs, conns = processes.start(ctx, _subtask_process, [((directory, k, share, per_blob, buffers, to_disk),
                                                                  start) for k in range(writers)])
        try:
            runs = [processes.answer(c, "channel-state writer", timeout=900) for c in conns]
        finally:
            processes.stop(procs)
    elapsed = max(r[1] for r in runs) - min(r[0] for r in runs)
    durable = [d for r in runs for d in r[3]]
    for p in directory.glob("job-1/cp-*/subtask-*.state"):
        p.unlink()
    for p in directory.glob("job-1/cp-*"):
        p.rmdir()
    return elapsed * total / sum(r[2] for r in runs), (statistics.mean(durable) * 1000 if durable else 0.0)


def disk_bench(directory: Path, s: Settings, status: Callable[[str], None] = lambda m: None) -> DiskStats:
    """Raw sequential bandwidth and channel-state bandwidth, alternated on the same directory."""
    directory.mkdir(parents=True, exist_ok=True)
    total = s.disk_total_mib << 20
    blob = inflight_capacity_bytes(s.network())
    bufs = realistic_buffers(s)
    st = DiskStats(str(directory), total, blob, len(bufs[0][0]), writers=s.disk_writers)
    mib = total / (1 << 20)
    for i in range(s.disk_repeats):
        status(f"raw sequential write {i + 1}/{s.disk_repeats}")
        st.raw_mib_s.append(mib / raw_write(directory / "raw.bin", total))
        status(f"channel-state writer to files {i + 1}/{s.disk_repeats}")
        secs, fs = channel_state_write(directory, total, blob, bufs, writers=s.disk_writers)
        st.channel_state_mib_s.append(mib / secs)
        st.fsync_per_blob_ms.append(fs)
        status(f"channel-state writer in memory {i + 1}/{s.disk_repeats}")
        secs, _ = channel_state_write(directory, total, blob, bufs, to_disk=False)
        st.writer_only_mib_s.append(mib / secs)
    return st
