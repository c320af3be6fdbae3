#!/usr/bin/env python3
"""Serve moto's WSGI app single-threaded, so that conditional writes are atomic.

`moto_server` runs werkzeug with threaded=True. Its S3 backend checks
If-None-Match / If-Match and then writes, with no lock in between, so two
racing requests can both win. Served by one thread in one process, requests
are handled one at a time and the check-then-write becomes atomic.

This mirrors moto.server.main (moto 5.2.x) except for threaded=False:
same app, same request handler, MOTO_PORT set, SIGTERM -> clean exit.

Usage: moto_single.py [--host 127.0.0.1] [--port 9000]
Started and stopped by ci/test-servers.
"""

import argparse
import os
import signal
import sys

from werkzeug.serving import run_simple

from moto.server import DomainDispatcherApplication, create_backend_app

try:  # moto >= 5.1.x: keeps underscores in header names (S3 user metadata)
    from moto.server import MotoRequestHandler
except ImportError:  # pragma: no cover - older moto
    MotoRequestHandler = None


def _exit(signum, frame):
    sys.exit(0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=9000)
    args = parser.parse_args()

    # moto uses MOTO_PORT to build URLs that point back to itself.
    os.environ.setdefault("MOTO_PORT", str(args.port))
    signal.signal(signal.SIGTERM, _exit)
    signal.signal(signal.SIGINT, _exit)

    app = DomainDispatcherApplication(create_backend_app)
    app.debug = True  # as moto_server does

    kwargs = {}
    if MotoRequestHandler is not None:
        kwargs["request_handler"] = MotoRequestHandler

    # threaded=False, processes=1: one request at a time. With neither threads
    # nor processes, werkzeug answers HTTP/1.0 and closes each connection, so
    # an idle keep-alive client cannot hold the single worker.
    run_simple(
        args.host,
        args.port,
        app,
        threaded=False,
        processes=1,
        use_reloader=False,
        use_debugger=False,
        **kwargs,
    )


if __name__ == "__main__":
    main()
