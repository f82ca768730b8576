"""``free_port`` hands a child process a port no outgoing connection can take first."""

from __future__ import annotations

import socket
from pathlib import Path

from pyrula_stream.kafka.local.broker import free_port


def test_ports_lie_below_the_ephemeral_range_bind_and_are_never_given_twice() -> None:
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    ports = [free_port() for _ in range(200)]
    assert len(set(ports)) == len(ports)
    assert all(1024 <= p < low for p in ports)
    with socket.socket() as s:  # free when handed out: the child can bind it
        s.bind(("127.0.0.1", ports[-1]))


def test_outgoing_connections_never_take_a_picked_port() -> None:
    """What raced before: a port from ``bind(0)`` is one the kernel also gives outgoing
    connections, so a Kafka client's connection could take it before the worker bound it."""
    picked = {free_port() for _ in range(50)}
    with socket.create_server(("127.0.0.1", 0), backlog=512) as server:
        address = server.getsockname()
        clients = [socket.create_connection(address) for _ in range(200)]
        try:
            assert not {c.getsockname()[1] for c in clients} & picked
        finally:
            for c in clients:
                c.close()
