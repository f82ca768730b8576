"""A network partition between Kafka clients and their broker, on demand.

``PartitionProxy`` forwards a port to the broker's; a broker started with
``start_local_broker(advertised_port=proxy.port)`` sends every client through it. ``cut()``
drops every open connection and holds new ones without an answer (the coordinator goes
away under a client, as in a partition that resets connections); ``heal()`` lets them
through again. Nothing here touches the machine's network settings.
"""

from __future__ import annotations

import contextlib
import socket
import threading


class PartitionProxy:
    """Forwards ``127.0.0.1:port`` to ``127.0.0.1:upstream``; ``cut()``/``heal()``."""

    def __init__(self, port: int, upstream: int) -> None:
        self.port, self.upstream = port, upstream
        self._up = threading.Event()
        self._up.set()
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._server = socket.create_server(("127.0.0.1", port))
        self._closed = False
        threading.Thread(target=self._accept, name="pyrula-partition", daemon=True).start()

    @property
    def bootstrap_servers(self) -> str:
        return f"127.0.0.1:{self.port}"

    def cut(self) -> None:
        """Drop every connection; new ones hear nothing until ``heal()``."""
        self._up.clear()
        with self._lock:
            for sock in self._open:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
            self._open.clear()

    def heal(self) -> None:
        self._up.set()

    def close(self) -> None:
        """Stop listening and drop every connection."""
        self._closed = True
        self.cut()
        self._server.close()
        self._up.set()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        self._up.wait()  # a connection made during the partition hears nothing till it heals
        try:
            if self._closed:
                raise OSError("closed")
            server = socket.create_connection(("127.0.0.1", self.upstream))
        except OSError:
            client.close()
            return
        with self._lock:
            self._open |= {client, server}
        pumps = [
            threading.Thread(target=self._pump, args=(src, dst), daemon=True)
            for src, dst in ((client, server), (server, client))
        ]
        for pump in pumps:
            pump.start()
        for pump in pumps:
            pump.join()
        with self._lock:
            self._open -= {client, server}
        client.close()
        server.close()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                dst.sendall(data)
        for sock in (src, dst):  # the other direction ends too
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
