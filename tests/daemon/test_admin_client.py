"""`deepserve status|fault|scale --admin-url` pointed at a server that is not deepserve's admin API
(issue 29 §5: `internal error: JSONDecodeError`): one line naming the URL, exit 2 — the same as an
admin URL nothing listens on (a bad `--admin-url` is bad input). Called in this process."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from deepserve.cli.main import main

# What the stranger answers, by the first segment of the path the client was given.
ANSWERS: dict[str, tuple[int, str, bytes]] = {
    "html": (200, "text/html", b"<html><body>It works!</body></html>"),
    "empty": (200, "application/json", b""),
    "object": (200, "application/json", b'{"hello": "world"}'),
    "list": (200, "application/json", b"[1, 2, 3]"),
    "binary": (200, "application/octet-stream", b"\xff\xfe\x00garbage"),
    "notfound": (404, "text/html", b"<h1>Not Found</h1>"),
    "oops": (500, "application/json", b'{"detail": "boom"}'),
    "oddstatus": (200, "application/json", json.dumps({"model": "m", "tes": [{"te": "te/0"}], "requests": {},
                                                       "uptime_s": 1}).encode()),  # fmt: skip
    "oddfault": (200, "application/json", b'{"injected": [1]}'),
}


class Stranger(BaseHTTPRequestHandler):
    def _answer(self) -> None:
        code, kind, body = ANSWERS[self.path.strip("/").split("/")[0]]
        self.send_response(code)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _answer

    def log_message(self, *_: object) -> None:  # quiet
        pass


@pytest.fixture(scope="module")
def stranger() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Stranger)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def not_http() -> Iterator[str]:
    """A TCP server that greets like SSH and hangs up: no HTTP status line at all."""
    sock = socket.create_server(("127.0.0.1", 0))

    def greet() -> None:
        while True:
            try:
                conn, _ = sock.accept()
            except OSError:  # closed: the module is done
                return
            with conn:
                conn.sendall(b"SSH-2.0-OpenSSH_9.6\r\n")

    threading.Thread(target=greet, daemon=True).start()
    yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    sock.close()


def test_a_server_that_does_not_speak_http(not_http: str, capsys: pytest.CaptureFixture[str]) -> None:
    err = one_line(capsys, "status", "--admin-url", not_http)
    assert f"{not_http}/admin/status" in err and "deepserve's admin API" in err, err


def one_line(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    code = main(list(args))
    out, err = capsys.readouterr()
    assert code == 2 and out == "", (args, code, out, err)
    assert err.count("\n") == 1 and err.startswith("deepserve: error: ") and "internal error" not in err, err
    return err


@pytest.mark.parametrize("where", ["html", "empty", "object", "list", "binary", "notfound", "oops", "oddstatus"])
def test_status_from_a_stranger_is_one_line(stranger: str, where: str, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"{stranger}/{where}"
    err = one_line(capsys, "status", "--admin-url", url)
    assert "deepserve's admin API" in err, err
    assert f"{url}/admin/status" in err, err  # which server answered
    if where in ("object", "list", "notfound"):
        assert one_line(capsys, "status", "--json", "--admin-url", url) == err


@pytest.mark.parametrize("where", ["html", "object", "notfound", "oddfault"])
def test_fault_and_scale_from_a_stranger_are_one_line(stranger: str, where: str,
                                                      capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    url = f"{stranger}/{where}"
    err = one_line(capsys, "fault", "kill-te", "te/0", "--admin-url", url)
    assert "deepserve's admin API" in err and f"{url}/admin/fault" in err, err
    err = one_line(capsys, "scale", "m/colocated", "1", "--admin-url", url)
    assert "deepserve's admin API" in err and f"{url}/admin/scale" in err, err
