#!/usr/bin/env python3
"""Races GCS preconditions on fake-gcs-server through its JSON upload API (raw HTTP).

usage: race.py HOST:PORT BUCKET WRITERS ROUNDS
Per round, on a fresh key:
  create: WRITERS concurrent uploads with ifGenerationMatch=0
  swap:   one create, then WRITERS concurrent uploads with ifGenerationMatch=<that generation>
Counts rounds with != 1 winner, status codes of losers, and whether the stored body is the winner's.
"""
import http.client, json, sys, threading, time, uuid, collections

hostport, bucket, writers, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
host, port = hostport.split(":")

def conn():
    return http.client.HTTPConnection(host, int(port), timeout=30)

def upload(c, name, body, gen):
    q = f"/upload/storage/v1/b/{bucket}/o?uploadType=media&name={name}&ifGenerationMatch={gen}"
    c.request("POST", q, body=body, headers={"Content-Type": "application/octet-stream",
                                            "x-goog-meta-cojobwrite": body.decode()})
    r = c.getresponse(); data = r.read()
    return r.status, (json.loads(data) if r.status == 200 else None)

def get(c, name):
    c.request("GET", f"/download/storage/v1/b/{bucket}/o/{name}?alt=media")
    r = c.getresponse(); data = r.read()
    return r.status, data, r.getheader("x-goog-generation")

conns = [conn() for _ in range(writers)]
main = conn()

def race(name, gen):
    barrier = threading.Barrier(writers)
    results = [None] * writers
    def run(i):
        body = f"w{i}-{uuid.uuid4().hex[:8]}".encode()
        barrier.wait()
        try:
            st, obj = upload(conns[i], name, body, gen)
        except Exception as e:  # a broken connection is reported, then replaced
            conns[i] = conn(); st, obj = f"exc:{type(e).__name__}", None
        results[i] = (st, body, obj)
    ts = [threading.Thread(target=run, args=(i,)) for i in range(writers)]
    for t in ts: t.start()
    for t in ts: t.join()
    return results

def summarize(kind, gen_of):
    bad, statuses, body_mismatch, gens = 0, collections.Counter(), 0, set()
    t0 = time.time()
    for r in range(rounds):
        name = f"race-{kind}-{uuid.uuid4().hex}"
        gen = gen_of(name)
        res = race(name, gen)
        winners = [x for x in res if x[0] == 200]
        for x in res:
            if x[0] != 200: statuses[x[0]] += 1
        if len(winners) != 1:
            bad += 1
        st, data, g = get(main, name)
        if len(winners) == 1 and (data != winners[0][1] or g != winners[0][2]["generation"]):
            body_mismatch += 1
        for w in winners: gens.add(w[2]["generation"])
    dt = time.time() - t0
    print(f"{kind}: {writers} writers x {rounds} rounds: rounds with !=1 winner: {bad}/{rounds}; "
          f"loser statuses: {dict(statuses)}; stored body/generation != winner's: {body_mismatch}; "
          f"{dt:.1f}s")

def fresh_gen(name):
    st, obj = upload(main, name, b"base", 0)
    assert st == 200, st
    return obj["generation"]

summarize("create", lambda name: 0)
summarize("swap", fresh_gen)
