"""A toy engine: everything cleanslate needs to know about a new engine, in one file.

Importing this module registers engine ``toy``: how to launch it, how to recognise its
processes, what it leaves in ``/dev/shm``. No other file changes: ``check`` reports its
processes as strays and its ``/dev/shm`` files as leftovers, ``clean --engine toy`` finds them
by signature, ``serve`` launches it and waits until ready, ``stop`` removes the run's files
(``tests/engines/test_toy_engine.py``).

Run as a script (``python toy_engine.py --model M --port P``) it is the server the adapter
launches: a few lines of standard library that answer ``/health`` and ``/v1/completions``, hold
a ``/dev/shm/toy-engine-<pid>`` file, and start a helper process named ``toy::worker`` that, like
the schedulers of real engines, outlives a killed server.
"""

from __future__ import annotations

import os

from cleanslate.engines import EngineAdapter, Leftovers, register_engine
from cleanslate.engines.signatures import ProcessSignature, any_of, program


@register_engine
class ToyEngine(EngineAdapter):
    name = "toy"
    description = "a toy OpenAI-compatible server (tests/engines/toy_engine.py)"
    default_port = 8765
    default_model_flag = "--model"
    reserved_flags = ("--port", "--host", "--model")
    supports_chat = False
    local_python = True  # launched with the interpreter running cleanslate
    leftovers = Leftovers(shm_globs=("toy-engine-*",), process_names=("toy::worker",),
                          notes="the worker outlives a killed server")
    signature = ProcessSignature.compile(
        "toy", r"^toy::", any_of(program(r"toy_engine\.py"), r"^toy::"),
        "the toy server and its toy::worker")

    def default_launch(self) -> tuple[str, ...]:
        return (self.python, os.path.abspath(__file__))


# -- the toy server (what the adapter launches) -------------------------------------------------


def _serve() -> None:
    import argparse
    import ctypes
    import json
    import signal
    import time
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    parser = argparse.ArgumentParser(description="the toy engine's server")
    parser.add_argument("--model", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--greeting", default="Paris is the capital and largest city of France.")
    args = parser.parse_args()

    shm = f"/dev/shm/toy-engine-{os.getpid()}"
    with open(shm, "wb") as fh:
        fh.write(b"toy")
    if os.fork() == 0:  # the worker: renamed, and left running when the server dies
        ctypes.CDLL(None).prctl(15, b"toy::worker", 0, 0, 0)  # PR_SET_NAME
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        while True:
            time.sleep(60)

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *_: object) -> None:
            pass

        def _send(self, status: int, body: bytes, kind: str = "application/json") -> None:
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            self._send(200 if self.path == "/health" else 404, b"{}")

        def do_POST(self) -> None:
            request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if self.path != "/v1/completions":
                self._send(404, b'{"error": {"message": "not found"}}')
                return
            choice = {"index": 0, "text": args.greeting, "finish_reason": "stop"}
            answer = {"id": "toy", "object": "text_completion", "model": args.model,
                      "choices": [choice]}
            if not request.get("stream"):
                self._send(200, json.dumps(answer).encode())
                return
            events = f"data: {json.dumps(answer)}\n\ndata: [DONE]\n\n".encode()
            self._send(200, events, "text/event-stream")

    ThreadingHTTPServer((args.host, args.port), Handler).serve_forever()


if __name__ == "__main__":
    _serve()
