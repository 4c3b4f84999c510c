"""The HTTP server of `attngen serve-demo`: the standard library's file server on 127.0.0.1,
hardened against requests it would otherwise answer with a traceback (docs/cli.md)."""

from __future__ import annotations

import http.server
import sys


class DemoHandler(http.server.SimpleHTTPRequestHandler):
    """Serves the demo folder; a path the file system cannot name is a bad request."""

    def send_head(self):
        # A NUL byte (raw or %00) makes open() raise ValueError, which the standard handler does
        # not catch: the connection closed without an answer and a traceback was printed.
        try:
            return super().send_head()
        except ValueError:
            self.send_error(400, "bad path")
            return None


class DemoServer(http.server.ThreadingHTTPServer):
    """A threading server whose failed requests are one line on standard error, not a traceback."""

    daemon_threads = True  # Ctrl-C does not wait for open connections

    def handle_error(self, request, client_address):
        error = sys.exc_info()[1]
        try:
            print(f"serve-demo: a request from {client_address[0]} failed: {type(error).__name__}: {error}",
                  file=sys.stderr, flush=True)
        except (OSError, ValueError):
            pass
