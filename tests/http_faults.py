#!/usr/bin/env python3
"""A misbehaving HTTP server for tests/cli_remote.sh (issue 18): serves the
files of a directory with byte ranges on 127.0.0.1, with faults chosen by
the first path component:

  /ok/NAME      every request answered correctly
  /flaky/NAME   odd-numbered requests fail, alternately by a connection
                reset (closed before any answer) and by a body cut short
                (headers promise the range, half of it is sent); the retry
                that follows is answered correctly
  /swap/NAME    after AFTER correct answers, ranges come from NAME.swap (a
                file of the same size with other bytes: the object replaced)
  /grow/NAME    after AFTER correct answers, the object is 4096 bytes longer

Prints the port on stdout, serves until killed; stops by itself after
--seconds (a bound for a test that forgets it). Only 127.0.0.1."""

import argparse
import os
import re
import socket
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

COUNT = {"flaky": 0, "swap": 0, "grow": 0}
LOCK = threading.Lock()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):  # quiet
        pass

    def do_GET(self):
        parts = self.path.lstrip("/").split("/", 1)
        if len(parts) != 2 or parts[0] not in ("ok", "flaky", "swap", "grow") or "/" in parts[1]:
            self.send_error(404)
            return
        mode, name = parts
        path = os.path.join(self.server.root, name)
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError:
            self.send_error(404)
            return
        with LOCK:
            n = COUNT.get(mode, 0) + 1
            COUNT[mode] = n
        late = n > self.server.after
        if mode == "swap" and late:
            with open(path + ".swap", "rb") as f:
                data = f.read()
        if mode == "grow" and late:
            data = data + bytes(4096)
        m = re.fullmatch(r"bytes=(\d+)-(\d+)", self.headers.get("Range", ""))
        if not m:
            self.send_error(400, "a range is required here")
            return
        a, b = int(m.group(1)), min(int(m.group(2)), len(data) - 1)
        if a > b:
            self.send_response(416)
            self.send_header("Content-Range", "bytes */%d" % len(data))
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        body = data[a:b + 1]
        if mode == "flaky" and n % 2 == 1 and n % 4 == 1:
            # a reset: no answer at all
            self.connection.shutdown(socket.SHUT_RDWR)
            self.close_connection = True
            return
        self.send_response(206)
        self.send_header("Content-Range", "bytes %d-%d/%d" % (a, b, len(data)))
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if mode == "flaky" and n % 2 == 1:
            # a body cut short
            self.wfile.write(body[:len(body) // 2])
            self.wfile.flush()
            self.connection.shutdown(socket.SHUT_RDWR)
            self.close_connection = True
            return
        self.wfile.write(body)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("root")
    ap.add_argument("--after", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=300)
    a = ap.parse_args()
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    srv.root = a.root
    srv.after = a.after
    srv.daemon_threads = True
    print(srv.server_address[1], flush=True)
    threading.Timer(a.seconds, srv.shutdown).start()
    srv.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
