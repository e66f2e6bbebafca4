"""The message format on a channel's TCP connection: ``[u8 type][u32 aux][u32 length][payload]``."""

from __future__ import annotations

import json
import socket
import struct

HEADER = struct.Struct("<BII")

HELLO = 1  # receiver -> sender: JSON {"channel": name}; opens the channel
BUFFER = 2  # sender -> receiver: aux = backlog, payload = buffer bytes; uses one credit
EVENT = 3  # sender -> receiver: in-order event (JSON), needs no credit
PRIORITY = 4  # sender -> receiver: priority event (JSON) that overtook queued buffers, needs no credit
CREDIT = 5  # receiver -> sender: aux = number of new credits
END = 6  # sender -> receiver: end of partition, nothing follows
RECOVERY_END = 7  # sender -> receiver: the restored output channel state was sent; new output follows
BUFFER_SIZE = 8  # receiver -> sender: aux = the size to cut buffers at from now on (buffer debloating)


class ConnectionClosed(EOFError):
    """The peer closed the connection."""


def send(sock: socket.socket, kind: int, aux: int = 0, payload: bytes = b"") -> None:
    """Write one message; small payloads go out in one write with their header."""
    header = HEADER.pack(kind, aux, len(payload))
    if len(payload) < 4096:
        sock.sendall(header + payload)
    else:
        sock.sendall(header)
        sock.sendall(payload)


def send_json(sock: socket.socket, kind: int, obj: dict) -> None:
    send(sock, kind, 0, json.dumps(obj).encode())


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    if n == 0:
        return b""
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise ConnectionClosed("connection closed by peer")
        got += k
    return bytes(buf)


def recv(sock: socket.socket) -> tuple[int, int, bytes]:
    """Read one message: (type, aux, payload)."""
    kind, aux, length = HEADER.unpack(_recv_exact(sock, HEADER.size))
    return kind, aux, _recv_exact(sock, length)


def close(sock: socket.socket) -> None:
    """Shut the connection down both ways (a reader blocked on it wakes up), then close it."""
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()
