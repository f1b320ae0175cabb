"""`free_port`: two test processes starting servers at once (pytest-xdist workers) never get the same port."""

import socket
import subprocess
import sys

from tests.support.helpers import subprocess_env
from tests.support.servers import _unassigned_range, free_port

TAKE = """
import sys
from tests.support.servers import free_port
ports = [free_port() for _ in range(40)]
print(" ".join(map(str, ports)), flush=True)
sys.stdin.read()  # hold the reservations until the test has them all
"""


def test_processes_taking_ports_at_once_never_share_one_and_each_port_is_bindable():
    procs = [subprocess.Popen([sys.executable, "-c", TAKE], env=subprocess_env(), stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True) for _ in range(4)]
    try:
        taken = [[int(p) for p in proc.stdout.readline().split()] for proc in procs]
        mine = [free_port() for _ in range(40)]  # while the others still hold theirs
    finally:
        for proc in procs:
            proc.stdin.close()
            proc.wait(timeout=60)
    every = [p for ports in taken for p in ports] + mine
    assert [len(ports) for ports in taken] == [40] * 4
    assert len(set(every)) == len(every) == 200, "a port was handed out twice"
    low, high = _unassigned_range()
    assert all(low <= p < high for p in every), "a port from the range the kernel hands out by itself"
    with socket.socket() as s:  # reserved, not occupied: a server binds it
        s.bind(("127.0.0.1", mine[0]))
        s.listen()
