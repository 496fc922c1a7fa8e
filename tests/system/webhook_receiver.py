"""A webhook receiver for the tests: ``python -m tests.system.webhook_receiver PORT SECRET LOG``.

Checks each request's ``Authorization`` (hex HMAC-SHA256 of the body, as dbt Cloud signs) and
appends one JSON line per request to LOG: the event id and type, whether the signature held, and
the body. Answers 200, or 401 to a bad signature.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def main() -> None:
    port, secret, log_path = int(sys.argv[1]), sys.argv[2].encode(), sys.argv[3]

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            expected = hmac.new(secret, body, hashlib.sha256).hexdigest()
            valid = hmac.compare_digest(expected, self.headers.get("Authorization", ""))
            event = json.loads(body) if valid else {}
            line = {
                "event_id": event.get("eventId"),
                "event_type": event.get("eventType"),
                "valid": valid,
                "body": body.decode(),
            }
            with open(log_path, "a", encoding="utf-8") as log:
                log.write(json.dumps(line) + "\n")
            self.send_response(200 if valid else 401)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: object) -> None:
            return

    ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()


if __name__ == "__main__":
    main()
