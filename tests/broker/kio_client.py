"""A raw Kafka protocol client for tests that must send exact requests (kio's messages over a socket)."""

from __future__ import annotations

import io
import socket
import struct
from typing import Any

from kio.index import load_request_schema, load_response_schema
from kio.serial import entity_reader, entity_writer


class RawClient:
    def __init__(self, host: str, port: int, timeout: float = 60.0) -> None:
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self._correlation = 0

    def call(self, api_key: int, version: int, body: Any) -> Any:
        """Send ``body`` (a kio request entity of ``api_key``/``version``), return the decoded response."""
        schema = load_request_schema(api_key, version)
        self._correlation += 1
        header_schema = schema.__header_schema__
        fields = {
            "request_api_key": api_key,
            "request_api_version": version,
            "correlation_id": self._correlation,
        }
        if "client_id" in header_schema.__dataclass_fields__:
            fields["client_id"] = "raw-test"
        out = io.BytesIO()
        entity_writer(header_schema)(out, header_schema(**fields))
        entity_writer(schema)(out, body)
        frame = out.getvalue()
        self.sock.sendall(struct.pack(">i", len(frame)) + frame)
        data = self._read(struct.unpack(">i", self._read(4))[0])
        response = load_response_schema(api_key, version)
        header, at = entity_reader(response.__header_schema__)(data, 0)
        assert header.correlation_id == self._correlation
        decoded, _ = entity_reader(response)(data, at)
        return decoded

    def _read(self, n: int) -> bytes:
        buf = b""
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise ConnectionError("closed by the broker")
            buf += chunk
        return buf

    def close(self) -> None:
        self.sock.close()
