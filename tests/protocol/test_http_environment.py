"""HttpTransport reads the environment once: proxies and NO_PROXY are honoured, the CA
bundle is kept, and a ~/.netrc password never replaces the credentials we send."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from serverless_worker.protocols._http import HttpTransport

_PROXY_VARS = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY",
               "http_proxy", "https_proxy", "all_proxy", "no_proxy", "NETRC",
               "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE")


class _Recorder(ThreadingHTTPServer):
    """A loopback server that records each request line and headers. An absolute-form
    target (``GET http://host:port/path``) is a proxied request: it is answered here, as
    a proxy would relay the answer, and never forwarded (nothing leaves the machine)."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.seen: list[tuple[str, dict[str, str]]] = []
        self.url = f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    server: _Recorder

    def do_GET(self) -> None:
        self.server.seen.append((self.path, dict(self.headers)))
        target = urlsplit(self.path)
        status, body = 200, b'{"proxied":true}' if target.scheme == "http" else b'{"origin":true}'
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def recorder() -> Iterator[_Recorder]:
    server = _Recorder()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in _PROXY_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))


def _sandbox_status(transport: HttpTransport) -> int:
    return transport.request("GET", "/_admin/jobs", endpoint="admin").status


def test_requests_reach_a_loopback_sandbox_without_trusting_the_environment(serve, admin_for) -> None:
    server = serve("claimqueue")
    admin_for(server).seed({"queue": "q", "items": [{"n": 1}]})
    transport = HttpTransport(server.url)
    try:
        assert transport.proxy is None
        answer = transport.request("GET", "/_admin/jobs", endpoint="admin")
        assert answer.status == 200
        assert [job["item"] for job in answer.json()["jobs"]] == [{"n": 1}]
        assert transport.calls["admin"] == 1
    finally:
        transport.close()


def test_http_proxy_from_the_environment_is_used(recorder: _Recorder, monkeypatch: pytest.MonkeyPatch) -> None:
    # a remote server (never contacted: the proxy answers) through a proxy on loopback
    monkeypatch.setenv("HTTP_PROXY", recorder.url)
    transport = HttpTransport("http://jobs.example.test:8080", allow_insecure_http=True)
    try:
        assert transport.proxy == recorder.url
        answer = transport.request("GET", "/_admin/jobs", endpoint="admin")
        assert (answer.status, answer.json()) == (200, {"proxied": True})
    finally:
        transport.close()
    assert [path for path, _ in recorder.seen] == ["http://jobs.example.test:8080/_admin/jobs"]


def test_no_proxy_bypasses_the_proxy(serve, recorder: _Recorder, monkeypatch: pytest.MonkeyPatch) -> None:
    server = serve("claimqueue")
    monkeypatch.setenv("HTTP_PROXY", recorder.url)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    transport = HttpTransport(server.url)
    try:
        assert _sandbox_status(transport) == 200
    finally:
        transport.close()
    assert recorder.seen == []


def test_environment_is_read_once_at_construction(recorder: _Recorder, monkeypatch: pytest.MonkeyPatch) -> None:
    transport = HttpTransport("http://jobs.example.test:8080", allow_insecure_http=True)
    monkeypatch.setenv("HTTP_PROXY", recorder.url)  # too late for this transport
    try:
        assert transport.proxy is None
    finally:
        transport.close()
    assert recorder.seen == []


def test_netrc_password_is_never_sent(recorder: _Recorder, tmp_path: Path) -> None:
    netrc = tmp_path / ".netrc"
    netrc.write_text("machine 127.0.0.1 login someone password netrc-secret\n")
    netrc.chmod(0o600)
    transport = HttpTransport(recorder.url)
    try:
        assert transport.request("GET", "/plain", endpoint="plain").status == 200
        assert transport.request("GET", "/ours", endpoint="ours",
                                 headers={"Authorization": "Bearer ours"}).status == 200
    finally:
        transport.close()
    [(_, plain), (_, ours)] = recorder.seen
    assert "Authorization" not in plain
    assert ours["Authorization"] == "Bearer ours"


def test_ca_bundle_from_the_environment_is_kept(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    bundle = tmp_path / "ca.pem"
    bundle.write_text("")
    monkeypatch.setenv("CURL_CA_BUNDLE", str(bundle))
    transport = HttpTransport("https://jobs.example.com")
    try:
        assert transport.ca_bundle == str(bundle)
    finally:
        transport.close()
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(tmp_path / "other.pem"))
    transport = HttpTransport("https://jobs.example.com")
    try:
        assert transport.ca_bundle == str(tmp_path / "other.pem")
    finally:
        transport.close()


def test_a_base_url_with_a_path_prefixes_every_call_and_params_become_the_query(recorder: _Recorder) -> None:
    # given a server mounted under /jobs-api
    transport = HttpTransport(recorder.url + "/jobs-api/")
    try:
        # when calls go to it with and without parameters, and to the base itself
        transport.request("GET", "/items", endpoint="items")
        transport.request("GET", "/items", endpoint="items", params={"state": "open", "skip": None, "n": 2})
        transport.request("GET", "", endpoint="probe")
    finally:
        transport.close()

    # then each is sent under the prefix, with the parameters given (None left out)
    assert [path for path, _ in recorder.seen] == ["/jobs-api/items", "/jobs-api/items?state=open&n=2", "/jobs-api"]
