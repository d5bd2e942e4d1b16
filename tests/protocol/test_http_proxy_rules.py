"""The plain-HTTP rule covers the proxy hop too (protocols/_proxy.py, docs/settings.md):
a loopback server is never reached through a proxy, and no secret crosses a plain-text hop
to a proxy off loopback (its own credentials, or an http:// server's key) unless
``allow_insecure_http``; an https:// server is tunnelled, so a plain proxy without
credentials is fine. The proxies here are recording servers on loopback;
the remote job servers (``*.example.test``, which never resolves) are never contacted."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator

import pytest

from serverless_worker.errors import ConfigurationError, ServerUnavailableError
from serverless_worker.model import Outcome, OutcomeKind
from serverless_worker.protocols._http import HttpTransport
from serverless_worker.protocols.base import PullRequest
from serverless_worker.protocols.claimqueue import ClaimQueueClient
from serverless_worker.protocols.priostack import PriostackClient
from serverless_worker.sandbox._server import SandboxServer
from serverless_worker.sandbox.admin import SandboxAdmin

KEY = "psk-proxy-rules-key-91c2"
PROXY_VARS = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "all_proxy",
              "no_proxy")


class _RecordingProxy:
    """A loopback TCP server that records what each connection sends up to the end of its
    headers, then refuses (403) and closes: it forwards nothing anywhere."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.seen: list[bytes] = []
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                data = b""
                while b"\r\n\r\n" not in data:
                    chunk = conn.recv(65536)
                    if not chunk:
                        break
                    data += chunk
                self.seen.append(data)
                conn.sendall(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def proxy() -> Iterator[_RecordingProxy]:
    recording = _RecordingProxy()
    yield recording
    recording.close()


@pytest.fixture(autouse=True)
def _no_proxy_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in PROXY_VARS:
        monkeypatch.delenv(name, raising=False)


@pytest.mark.parametrize("variable", ["HTTP_PROXY", "http_proxy", "ALL_PROXY"])
def test_a_loopback_server_is_never_reached_through_a_proxy(
        variable: str, proxy: _RecordingProxy, monkeypatch: pytest.MonkeyPatch,
        serve: Callable[..., SandboxServer], admin_for: Callable[[SandboxServer], SandboxAdmin]) -> None:
    # given a job server on loopback over plain http:// and a proxy in the environment
    server = serve("priostack", api_keys=[KEY])
    admin = admin_for(server)  # (requests, which the admin client uses, reads the proxy on each call)
    admin.seed({"jobs": [{"type": "t", "count": 2}]})
    monkeypatch.setenv(variable, proxy.url)
    client = PriostackClient(server.url, KEY)  # the environment is read here, once
    monkeypatch.delenv(variable)
    # when a worker pulls and reports
    with client:
        assert client._transport.proxy is None
        for delivery in client.pull(PullRequest(handler="t", max_items=2)):
            client.report(delivery, Outcome(kind=OutcomeKind.SUCCESS, value={"ok": True}))
    # then the work was done on the server and the proxy saw nothing at all, key included
    assert {job["state"] for job in admin.jobs()} == {"completed"}
    assert proxy.seen == []


@pytest.mark.parametrize("variable", ["HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"])
def test_the_claim_queue_work_socket_to_loopback_is_never_proxied_either(
        variable: str, proxy: _RecordingProxy, monkeypatch: pytest.MonkeyPatch,
        serve: Callable[..., SandboxServer], admin_for: Callable[[SandboxServer], SandboxAdmin]) -> None:
    # websockets reads proxies from the environment itself (HTTPS_PROXY even for ws://) and
    # does not bypass loopback: the socket takes the transport's choice instead
    server = serve("claimqueue", tokens=[KEY])
    admin = admin_for(server)
    admin.seed({"queue": "q", "items": [{"n": 1}]})
    monkeypatch.setenv(variable, proxy.url)
    with ClaimQueueClient(server.url, KEY, transport="socket") as client:
        [delivery] = client.pull(PullRequest(handler="q", max_items=1))
        assert client.report(delivery, Outcome(kind=OutcomeKind.SUCCESS, value={"ok": True})).accepted
    monkeypatch.delenv(variable)
    assert [job["status"] for job in admin.jobs()] == ["finished"]
    assert proxy.seen == []


@pytest.mark.parametrize("host", ["localhost", "[::1]"])
def test_every_loopback_spelling_bypasses_the_proxy(host: str, proxy: _RecordingProxy,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HTTP_PROXY", proxy.url)
    transport = HttpTransport(f"http://{host}:9")
    try:
        assert transport.proxy is None
    finally:
        transport.close()


@pytest.mark.parametrize("proxy_url", ["http://user:pw-91c2@proxy.example.test:3128",
                                       "user:pw-91c2@proxy.example.test:3128",
                                       "socks5h://user:pw-91c2@proxy.example.test:1080"])
def test_a_plain_text_proxy_with_credentials_off_loopback_is_refused_without_the_opt_in(
        proxy_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # (an http:// server off loopback is refused by the same rule before any proxy is read)
    monkeypatch.setenv("HTTPS_PROXY", proxy_url)
    with pytest.raises(ConfigurationError, match=r"refusing the plain-text proxy .*proxy.example.test") as info:
        HttpTransport("https://jobs.example.test")
    assert "pw-91c2" not in str(info.value)  # the proxy's user info is never shown
    assert "allow_insecure_http" in str(info.value)


@pytest.mark.parametrize("proxy_url", ["http://proxy.example.test:3128", "socks5h://proxy.example.test:1080"])
def test_the_opt_in_allows_a_plain_text_proxy(proxy_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HTTPS_PROXY", proxy_url)
    transport = HttpTransport("https://jobs.example.test", allow_insecure_http=True)
    try:
        assert transport.proxy == proxy_url
    finally:
        transport.close()


@pytest.mark.parametrize("proxy_url", ["http://proxy.example.test:3128", "proxy.example.test:3128",
                                       "socks5h://proxy.example.test:1080"])
def test_a_plain_text_proxy_without_credentials_tunnels_an_https_server_without_the_opt_in(
        proxy_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # the usual corporate proxy: CONNECT keeps the key inside TLS, and the proxy has no secret
    monkeypatch.setenv("HTTPS_PROXY", proxy_url)
    transport = HttpTransport("https://jobs.example.test")
    try:
        assert transport.proxy == proxy_url
    finally:
        transport.close()


def test_a_plain_http_server_through_a_plain_text_proxy_needs_the_opt_in(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HTTP_PROXY", "http://proxy.example.test:3128")
    with pytest.raises(ConfigurationError):
        HttpTransport("http://jobs.example.test")
    transport = HttpTransport("http://jobs.example.test", allow_insecure_http=True)
    try:
        assert transport.proxy == "http://proxy.example.test:3128"
    finally:
        transport.close()


def test_an_https_proxy_needs_no_opt_in(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HTTPS_PROXY", "https://proxy.example.test:3129")
    transport = HttpTransport("https://jobs.example.test")
    try:
        assert transport.proxy == "https://proxy.example.test:3129"
    finally:
        transport.close()


def test_no_proxy_still_excludes_a_remote_server(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.example.test:3128")
    monkeypatch.setenv("NO_PROXY", "jobs.example.test")
    transport = HttpTransport("https://jobs.example.test")
    try:
        assert transport.proxy is None
    finally:
        transport.close()


def test_a_plain_text_proxy_on_loopback_tunnels_an_https_server_keeping_the_key_inside_tls(
        proxy: _RecordingProxy, monkeypatch: pytest.MonkeyPatch) -> None:
    # given an http:// proxy on this machine (a sidecar) and a remote https:// job server
    monkeypatch.setenv("HTTPS_PROXY", proxy.url)
    with PriostackClient("https://jobs.example.test", KEY) as client:
        assert client._transport.proxy == proxy.url
        # when a call is made (the proxy refuses to connect anywhere)
        with pytest.raises(ServerUnavailableError):
            client.pull(PullRequest(handler="t", max_items=1))
    # then the proxy saw a CONNECT to the server, and not the key
    [request] = proxy.seen
    assert request.startswith(b"CONNECT jobs.example.test:443 HTTP/1.1\r\n")
    assert KEY.encode() not in request and b"X-API-Key" not in request
