"""Ports promised to a process that has not bound them yet are never handed out again."""

from inhouse.launch.ports import free_port


def test_free_port_skips_the_ports_it_was_told_to_avoid() -> None:
    # The kernel hands ephemeral ports out again as soon as they are free: among 3,000
    # promised ports, 300 more draws repeat one of them almost surely unless it is avoided.
    promised = {free_port() for _ in range(3000)}
    for _ in range(300):
        port = free_port(promised)
        assert port not in promised
        promised.add(port)
