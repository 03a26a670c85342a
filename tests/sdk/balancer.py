"""A plain round-robin HTTP load balancer for the SDK replica runs (tests/sdk/run.sh).

Usage: balancer.py BASE_URL [BASE_URL ...]

Listens on 127.0.0.1 at a free port and prints its MCP URL (http://127.0.0.1:PORT/mcp) on the
first line. Each request goes to the next replica in turn, with its method, path, headers and
body; the answer (event streams included) is passed back as it arrives. A replica that refuses
the connection is skipped for the next. Standard library only.
"""

import http.client
import itertools
import sys
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

TARGETS = [urllib.parse.urlsplit(u) for u in sys.argv[1:]]
NEXT = itertools.count()
LOCK = threading.Lock()
HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "host"}


class Forward(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:  # quiet: the runner prints what fails
        pass

    def forward(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        body = self.rfile.read(length) if length else None
        headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
        for _ in range(len(TARGETS)):
            with LOCK:
                target = TARGETS[next(NEXT) % len(TARGETS)]
            conn = http.client.HTTPConnection(target.hostname, target.port, timeout=300)
            try:
                conn.request(self.command, self.path, body=body, headers=headers)
                answer = conn.getresponse()
            except ConnectionError:
                conn.close()
                continue
            self.send_response(answer.status)
            for k, v in answer.getheaders():
                if k.lower() not in HOP_BY_HOP:
                    self.send_header(k, v)
            # The answer's end is the connection's: no length is known for an event stream.
            self.send_header("connection", "close")
            self.end_headers()
            self.close_connection = True
            try:
                while chunk := answer.read1(65536):
                    self.wfile.write(chunk)
                    self.wfile.flush()
            except (ConnectionError, OSError):
                pass
            conn.close()
            return
        self.send_response(502)
        self.send_header("content-length", "0")
        self.end_headers()

    do_GET = do_POST = do_DELETE = forward


server = ThreadingHTTPServer(("127.0.0.1", 0), Forward)
server.daemon_threads = True
print(f"http://127.0.0.1:{server.server_address[1]}/mcp", flush=True)
server.serve_forever()
