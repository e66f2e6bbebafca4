"""Connecting subtasks: each listens on one TCP port; a receiver opens one connection per input channel."""

from __future__ import annotations

import json
import socket
import threading
import time

from spark_plugin.network import wire
from spark_plugin.network.input import InputGate
from spark_plugin.network.output import OutputChannel
from spark_plugin.plan.topology import InputChannelSpec


class Listener:
    """A subtask's server socket; accepted connections are matched to output channels by their HELLO."""

    def __init__(self, host: str = "0.0.0.0") -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((host, 0))
        self.sock.listen(128)
        self.port = self.sock.getsockname()[1]
        self._thread: threading.Thread | None = None
        self.errors: list[str] = []

    def serve(self, outputs: dict[str, OutputChannel]) -> None:
        """Accept the connections of the downstream peers in the background; each names its channel's key."""
        self._thread = threading.Thread(target=self._accept, args=(outputs,), name="accept", daemon=True)
        self._thread.start()

    def _accept(self, outputs: dict[str, OutputChannel]) -> None:
        expected = len(outputs)
        attached = 0
        while attached < expected:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            try:
                kind, _, payload = wire.recv(conn)
                key = json.loads(payload)["channel"]
                ch = outputs[key]
            except (OSError, EOFError, KeyError, ValueError) as e:
                self.errors.append(f"bad connection: {e}")
                conn.close()
                continue
            ch.attach(conn)
            attached += 1
        self.sock.close()

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


def connect_inputs(
    gate: InputGate, inputs: list[InputChannelSpec], addresses: dict[int, tuple[str, int]], timeout: float = 60.0
) -> None:
    """Open one connection per input channel to the upstream subtask's listener and attach it to the gate.

    ``addresses`` maps each subtask's position in the plan to where its listener is."""
    for index, spec in enumerate(inputs):
        host, port = addresses[spec.upstream_subtask]
        deadline = time.monotonic() + timeout
        while True:
            try:
                sock = socket.create_connection((host, port), timeout=10)
                break
            except OSError as e:
                if time.monotonic() > deadline:
                    raise ConnectionError(
                        f"cannot connect input channel {spec.info.name} to {host}:{port}: {e}"
                    ) from e
                time.sleep(0.05)
        sock.settimeout(None)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        wire.send_json(sock, wire.HELLO, {"channel": spec.key})
        gate.attach(index, sock)
