"""Clients connecting while a broker closes: every connection the broker accepted is closed by it (no socket
left for the garbage collector, which reports each as an unclosed transport), and the close still completes."""

from __future__ import annotations

import gc
import socket
import threading
import time
import warnings
from pathlib import Path

import pylog
from pylog.broker.broker import Broker


def test_connections_arriving_during_close_are_closed(tmp_path: Path) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for attempt in range(10):
            broker = pylog.serve(tmp_path / str(attempt))
            stop = threading.Event()
            socks: list[socket.socket] = []

            def dial(
                broker: Broker = broker, stop: threading.Event = stop, socks: list[socket.socket] = socks
            ) -> None:
                while not stop.is_set():
                    try:
                        socks.append(socket.create_connection((broker.host, broker.port), timeout=1))
                    except OSError:
                        pass

            dialers = [threading.Thread(target=dial) for _ in range(3)]
            for thread in dialers:
                thread.start()
            while len(socks) < 20:  # clients are connecting when the close starts
                time.sleep(0.001)
            broker.close()
            stop.set()
            for thread in dialers:
                thread.join()
            for sock in socks:
                sock.close()
            gc.collect()
    leaked = [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)]
    assert leaked == [], f"{len(leaked)} sockets left open by the broker, e.g. {leaked[0]}"
