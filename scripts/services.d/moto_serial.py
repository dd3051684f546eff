"""Serve moto (used here for DynamoDB) on loopback, one request at a time.

Why not `moto_server`: its werkzeug server is threaded and moto's DynamoDB
backend is not thread-safe, so concurrent conditional updates on one item
lose updates (measured: 3,519 successful decrements of 3,500 units). Here
the server is single-threaded (threaded=False) and, in case that is ever
changed, the WSGI app also runs under a lock that covers the whole response
body, so no two requests touch the backend at once.

Usage: python moto_serial.py [--host 127.0.0.1] [--port 18001] [--access-log]
"""

import argparse
import logging
import signal
import sys
import threading

from werkzeug.serving import run_simple

import moto
from moto.moto_server.werkzeug_app import (
    DomainDispatcherApplication,
    MotoRequestHandler,
    create_backend_app,
)


class Serialised:
    """WSGI middleware: one request in the app at a time, body included."""

    def __init__(self, app):
        self.app = app
        self.lock = threading.Lock()

    def __call__(self, environ, start_response):
        with self.lock:
            result = self.app(environ, start_response)
            try:
                # Drain under the lock: a lazy body could still run backend code.
                return [b"".join(result)]
            finally:
                close = getattr(result, "close", None)
                if close is not None:
                    close()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=18001)
    parser.add_argument("--access-log", action="store_true",
                        help="log every request (off: the tests make thousands)")
    args = parser.parse_args()

    if not args.access_log:
        logging.getLogger("werkzeug").setLevel(logging.WARNING)
    # A clean exit on TERM from `scripts/services down`.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))

    app = Serialised(DomainDispatcherApplication(create_backend_app))
    print(f"moto {moto.__version__} serialised server on "
          f"http://{args.host}:{args.port}", flush=True)
    run_simple(args.host, args.port, app, threaded=False, processes=1,
               use_reloader=False, request_handler=MotoRequestHandler)


if __name__ == "__main__":
    main()
