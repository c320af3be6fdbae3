#!/usr/bin/env python3
"""A cojob workload in Python, with nothing but the standard library.

It talks to the sidecar's workload API (HTTP on the Unix socket named by COJOB_API):
- GET  /v1/run            who am I: run id, epoch, attempt, cancel requested?
- GET  /v1/steps/<name>   a step an earlier attempt of this run completed, or 404
- POST /v1/steps/<name>   record a completed step once per run (a respawn gets it back)
- PUT  /v1/progress       merge progress into the run's state (`cojob runs -o json` shows it)
- POST /v1/fence          is my epoch still the current one?

A 409 from any call means this attempt was fenced (a newer attempt took the run over): stop
at once and discard the work. Prints one JSON line with what it did.
"""

import http.client
import json
import os
import socket
import sys


class UnixConnection(http.client.HTTPConnection):
    """HTTP over the sidecar's Unix socket."""

    def __init__(self, path):
        super().__init__("cojob")
        self.path = path

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(self.path)


def call(method, path, body=None):
    address = os.environ.get("COJOB_API", "unix:/var/run/cojob/api.sock")
    if not address.startswith("unix:"):
        sys.exit(f"COJOB_API {address!r} is not unix:<path>")
    conn = UnixConnection(address[len("unix:"):])
    payload = None if body is None else json.dumps(body)
    conn.request(method, path, body=payload, headers={"Content-Type": "application/json"})
    response = conn.getresponse()
    reply = json.loads(response.read() or b"{}")
    conn.close()
    if response.status == 409:
        sys.exit(f"fenced: {reply.get('error')}")  # a newer attempt owns the run
    return response.status, reply


def step(name, work):
    """Runs `work()` once per run: an earlier attempt's recorded result is returned instead."""
    status, reply = call("GET", f"/v1/steps/{name}")
    if status == 200:
        return reply["result"], False
    result = work()
    _, reply = call("POST", f"/v1/steps/{name}", result)
    return reply["result"], reply["won"]


def main():
    _, run = call("GET", "/v1/run")
    if run["cancel_requested"]:
        sys.exit("cancel requested before we started")
    rows, ran = step("download", lambda: {"rows": 1000, "by_epoch": run["epoch"]})
    call("PUT", "/v1/progress", {"downloaded": rows["rows"]})
    status, fence = call("POST", "/v1/fence", {"token": run["epoch"]})
    print(json.dumps({
        "run_id": run["run_id"],
        "epoch": run["epoch"],
        "download": rows,
        "download_ran_here": ran,
        "fence_current": fence.get("current"),
    }))


if __name__ == "__main__":
    main()
