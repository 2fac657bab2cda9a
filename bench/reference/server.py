"""Reference command server on Python's standard library (http.server.ThreadingHTTPServer).

The same wire contract as runtime/server for the calls the bench makes: POST /commands/{name}
with JSON kwargs -> {"result": ...}, GET /health -> {"status": "ok"}, errors as
{"error", "type"}, Bearer token. This is how the original design is built; the bench compares
our Node server against it on the same machine.
"""
import hmac
import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

TOKEN = sys.argv[2] if len(sys.argv) > 2 else ""
COUNTER = {"n": 0}


def add(x, y=2):
    return x + y


def increment(by=1):
    COUNTER["n"] += by
    return COUNTER["n"]


COMMANDS = {"add": add, "increment": increment}


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Headers and body go out in two writes; without TCP_NODELAY every keep-alive call would
    # wait ~40 ms on Nagle + delayed ACK, which says nothing about the server itself.
    disable_nagle_algorithm = True

    def log_message(self, *args):
        pass

    def send(self, status, body):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def authorized(self):
        given = self.headers.get("Authorization", "")
        return hmac.compare_digest(given, f"Bearer {TOKEN}") if TOKEN else True

    def do_GET(self):
        if self.path == "/health":
            return self.send(200, {"status": "ok"})
        self.send(404, {"error": f"no route {self.path}", "type": "RouteNotFoundError"})

    def do_POST(self):
        length = int(self.headers.get("Content-Length", "0"))
        raw = self.rfile.read(length) if length else b"{}"
        if not self.authorized():
            return self.send(401, {"error": "missing or wrong token", "type": "AuthenticationError"})
        if not self.path.startswith("/commands/"):
            return self.send(404, {"error": f"no route {self.path}", "type": "RouteNotFoundError"})
        command = COMMANDS.get(self.path[len("/commands/"):])
        if command is None:
            return self.send(404, {"error": "unknown command", "type": "CommandNotFoundError"})
        try:
            kwargs = json.loads(raw or b"{}")
        except ValueError as error:
            return self.send(400, {"error": str(error), "type": "InvalidJsonError"})
        try:
            return self.send(200, {"result": command(**kwargs)})
        except TypeError as error:
            return self.send(400, {"error": str(error), "type": "ArgumentError"})
        except Exception as error:  # noqa: BLE001 - the contract reports any command error
            return self.send(500, {"error": str(error), "type": type(error).__name__})


class Server(ThreadingHTTPServer):
    # The default backlog (5) drops connections at the bench's higher concurrency levels.
    request_queue_size = 1024
    daemon_threads = True


if __name__ == "__main__":
    server = Server(("127.0.0.1", int(sys.argv[1]) if len(sys.argv) > 1 else 0), Handler)
    print(json.dumps({"event": "listening", "port": server.server_address[1]}), flush=True)
    server.serve_forever()
