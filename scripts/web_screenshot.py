"""Write docs/web-demo.png: the demo page (examples/web/index.html, as `attngen serve-demo
--no-serve` writes it) after it has run a kernel in headless Chromium on SwiftShader.

    .venv/bin/python scripts/web_screenshot.py [SPEC] [--out docs/web-demo.png]

The page computes asynchronously (WebGPU), so the screenshot is taken through the DevTools
protocol once its log shows the result; Python's standard library only (a minimal WebSocket
client for the protocol's one connection).
"""

from __future__ import annotations

import argparse
import base64
import functools
import http.server
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class _WebSocket:
    """Just enough of RFC 6455 for the DevTools protocol: text frames, masked from the client."""

    def __init__(self, url: str):
        m = re.match(r"ws://([^:/]+):(\d+)(/.*)", url)
        self.sock = socket.create_connection((m.group(1), int(m.group(2))), timeout=120)
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall((f"GET {m.group(3)} HTTP/1.1\r\nHost: {m.group(1)}:{m.group(2)}\r\nUpgrade: websocket\r\n"
                           f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n").encode())
        head = b""
        while b"\r\n\r\n" not in head:
            head += self.sock.recv(1)
        if b" 101 " not in head.split(b"\r\n")[0]:
            raise RuntimeError(f"the DevTools WebSocket refused: {head[:100]!r}")
        self.next_id = 0

    def _read(self, n: int) -> bytes:
        buf = b""
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise RuntimeError("the DevTools connection closed")
            buf += chunk
        return buf

    def send(self, text: str):
        data, mask = text.encode(), os.urandom(4)
        n = len(data)
        head = bytes([0x81]) + (bytes([0x80 | n]) if n < 126 else bytes([0x80 | 126]) + n.to_bytes(2, "big")
                                if n < 65536 else bytes([0x80 | 127]) + n.to_bytes(8, "big"))
        self.sock.sendall(head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(data)))

    def recv(self) -> str:
        out = b""
        while True:
            b0, b1 = self._read(2)
            n = b1 & 0x7F
            if n == 126:
                n = int.from_bytes(self._read(2), "big")
            elif n == 127:
                n = int.from_bytes(self._read(8), "big")
            payload = self._read(n)
            out += payload
            if b0 & 0x80:  # FIN
                return out.decode()

    def call(self, method: str, **params):
        self.next_id += 1
        self.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            msg = json.loads(self.recv())
            if msg.get("id") == self.next_id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("spec", nargs="?", default=os.path.join(ROOT, "examples", "llama3_8b.attn"))
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "web-demo.png"))
    ap.add_argument("--query", default="Lq=33&Lk=70")
    args = ap.parse_args()
    browser = next((p for p in (shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome")) if p), None)
    if browser is None:
        sys.exit("no chromium on PATH")
    tmp = tempfile.mkdtemp(prefix="attngen-shot-")
    page = os.path.join(tmp, "page")
    subprocess.run([sys.executable, "-m", "attngen", "serve-demo", args.spec, "--target", "wgsl", "--dir", page,
                    "--no-serve"], check=True, cwd=ROOT)
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=page)
    handler.func.log_message = lambda *a: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/index.html?{args.query}"
    proc = subprocess.Popen([browser, "--headless=new", "--no-sandbox", "--enable-unsafe-webgpu",
                             "--use-webgpu-adapter=swiftshader", "--enable-features=Vulkan", "--disable-gpu-sandbox",
                             f"--user-data-dir={os.path.join(tmp, 'profile')}", "--no-first-run", "--hide-scrollbars",
                             "--remote-debugging-port=0", "--window-size=1100,360", url],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        port = None
        for line in proc.stderr:
            m = re.search(r"DevTools listening on ws://127\.0\.0\.1:(\d+)/", line)
            if m:
                port = int(m.group(1))
                break
        targets = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/json"))
        ws = _WebSocket(next(t for t in targets if t.get("type") == "page")["webSocketDebuggerUrl"])
        deadline = time.time() + 180
        text = ""
        while time.time() < deadline:
            text = ws.call("Runtime.evaluate", expression="document.getElementById('log').textContent")
            text = text.get("result", {}).get("value", "")
            if "reference" in text or "error" in text:
                break
            time.sleep(1)
        print(text)
        shot = ws.call("Page.captureScreenshot", format="png")
        with open(args.out, "wb") as f:
            f.write(base64.b64decode(shot["data"]))
        print(f"wrote {args.out}")
    finally:
        proc.kill()
        server.shutdown()
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
