"""``python -m benchmarks.http_calls``: CPU per HTTP call, the runtime's transport (``requests``
with a bounded, chunked read, ``protocols/_session.py``) against plain ``requests``, urllib3
and ``http.client``, on one sandbox over loopback.

Every job costs one to four calls to the job server, and the local worker is bound by
its own CPU, so a call's client-side CPU is a share of every job. Each client sends the
same Priostack ``complete`` (of a job the sandbox does not know, so the server's work is
the same small 404 for all) ``--calls`` times from one thread after a warm-up; the
figure is that thread's CPU time per call (``time.thread_time``), and the wall time
beside it. A figure, not a test: nothing here passes or fails.
"""

from __future__ import annotations

import argparse
import http.client
import json
import time
from collections.abc import Callable
from urllib.parse import urlsplit

import requests
import urllib3

from serverless_worker.protocols.transport import HttpTransport

from .harness import SandboxProcess

__all__ = ["main", "measure"]

_PATH = "/api/v1/jobs/999999/complete"
_BODY = {"variables": {"ok": True}}
_HEADERS = {"Content-Type": "application/json", "X-API-Key": "bench"}


def measure(call: Callable[[], object], calls: int) -> tuple[float, float]:
    """(CPU µs, wall µs) per call of ``call``, after a warm-up of 50."""
    for _ in range(50):
        call()
    cpu, wall = time.thread_time(), time.perf_counter()
    for _ in range(calls):
        call()
    return 1e6 * (time.thread_time() - cpu) / calls, 1e6 * (time.perf_counter() - wall) / calls


def _clients(url: str) -> dict[str, Callable[[], object]]:
    host, port = urlsplit(url).hostname or "127.0.0.1", urlsplit(url).port or 80
    session = requests.Session()
    transport = HttpTransport(url)
    pool = urllib3.HTTPConnectionPool(host, port, maxsize=1)
    connection = http.client.HTTPConnection(host, port)
    body = json.dumps(_BODY).encode()

    def plain() -> object:
        connection.request("POST", _PATH, body=body, headers=_HEADERS)
        return connection.getresponse().read()

    return {
        "requests.Session": lambda: session.post(url + _PATH, data=body, headers=_HEADERS, timeout=(3, 30)),
        "HttpTransport (the runtime's)": lambda: transport.request("POST", _PATH, endpoint="complete",
                                                                   json_body=_BODY, headers=_HEADERS),
        "urllib3 pool": lambda: pool.urlopen("POST", _PATH, body=body, headers=_HEADERS, retries=False),
        "http.client": plain,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.http_calls", description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=2000)
    args = parser.parse_args(argv)
    sandbox = SandboxProcess("priostack")
    try:
        print(f"{'client':32s} {'CPU µs/call':>12s} {'wall µs/call':>13s}")
        for name, call in _clients(sandbox.url).items():
            cpu, wall = measure(call, args.calls)
            print(f"{name:32s} {cpu:12.0f} {wall:13.0f}")
    finally:
        sandbox.stop()


if __name__ == "__main__":
    main()
