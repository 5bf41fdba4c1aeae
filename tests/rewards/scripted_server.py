"""A scripted OpenAI-compatible server on loopback for judge failure paths (retries, timeouts).

Real HTTP, deterministic replies: it answers YES when the prompt's predicted answer equals its
reference answer (case-insensitive), else NO. ``fail_first`` requests get HTTP 503 first and
``delay_s`` stalls each reply. The LLM itself is exercised against agents.openai_server.
"""

from __future__ import annotations

import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class ScriptedJudge:
    def __init__(self, fail_first: int = 0, delay_s: float = 0.0, status: int = 503, api_key: str | None = None):
        self.fail_first, self.delay_s, self.status, self.api_key = fail_first, delay_s, status, api_key
        self.requests: list[dict] = []
        self.headers: list[dict] = []
        self._lock = threading.Lock()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with owner._lock:
                    owner.requests.append(body)
                    owner.headers.append(dict(self.headers))
                    n = len(owner.requests)
                time.sleep(owner.delay_s)
                if owner.api_key and self.headers.get("Authorization") != f"Bearer {owner.api_key}":
                    return self._send(401, {"error": {"message": "bad key"}})
                if n <= owner.fail_first:
                    return self._send(owner.status, {"error": {"message": "try later"}})
                prompt = body["messages"][-1]["content"]
                ref = re.search(r"Reference answer: (.*)", prompt).group(1).strip().lower()
                pred = re.search(r"Predicted answer: (.*)", prompt).group(1).strip().lower()
                self._send(200, {"choices": [{"index": 0, "message": {"role": "assistant",
                                                                      "content": "YES" if ref == pred else "NO"}}]})

            def _send(self, code, payload):
                data = json.dumps(payload).encode()
                try:
                    self.send_response(code)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):  # the client timed out first
                    pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()
