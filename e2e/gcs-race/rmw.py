#!/usr/bin/env python3
"""THREADS x N read-modify-write increments of one counter with ifGenerationMatch, retry on 412.
Then: THREADS concurrent unconditional overwrites x ROUNDS, counting duplicate generations
(a reused generation would let a stale compare-and-swap succeed).
usage: rmw.py HOST:PORT BUCKET THREADS N ROUNDS"""
import http.client, json, sys, threading, uuid, collections, time
hostport, bucket, threads, n, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
host, port = hostport.split(":")
def conn(): return http.client.HTTPConnection(host, int(port), timeout=30)
def upload(c, name, body, gen=None):
    q = f"/upload/storage/v1/b/{bucket}/o?uploadType=media&name={name}"
    if gen is not None: q += f"&ifGenerationMatch={gen}"
    c.request("POST", q, body=body, headers={"Content-Type": "application/octet-stream"})
    r = c.getresponse(); d = r.read(); return r.status, (json.loads(d) if r.status == 200 else None)
def get(c, name):
    c.request("GET", f"/download/storage/v1/b/{bucket}/o/{name}?alt=media")
    r = c.getresponse(); d = r.read(); return r.status, d, r.getheader("x-goog-generation")
key = f"counter-{uuid.uuid4().hex}"
assert upload(conn(), key, b"0", 0)[0] == 200
retries = collections.Counter(); other = collections.Counter()
def worker():
    c = conn()
    for _ in range(n):
        while True:
            st, d, g = get(c, key)
            if st != 200: other[f"get {st}"] += 1; continue
            st, _ = upload(c, key, str(int(d) + 1).encode(), g)
            if st == 200: break
            if st == 412: retries["412"] += 1
            else: other[f"put {st}"] += 1
t0 = time.time()
ts = [threading.Thread(target=worker) for _ in range(threads)]
for t in ts: t.start()
for t in ts: t.join()
print(f"rmw: {threads}x{n} increments -> final {get(conn(), key)[1].decode()} (want {threads*n}); "
      f"412 retries {retries['412']}; other {dict(other)}; {time.time()-t0:.1f}s")
# generation uniqueness under racing unconditional writes
dups = 0; total = 0
conns = [conn() for _ in range(threads)]
for r in range(rounds):
    name = f"gens-{uuid.uuid4().hex}"; b = threading.Barrier(threads); gens = [None]*threads
    def w(i):
        b.wait(); st, o = upload(conns[i], name, f"x{i}".encode()); gens[i] = o["generation"] if o else st
    ts = [threading.Thread(target=w, args=(i,)) for i in range(threads)]
    for t in ts: t.start()
    for t in ts: t.join()
    total += len(gens); dups += len(gens) - len(set(gens))
print(f"overwrite generations: {threads} racing writers x {rounds} rounds: {dups} duplicate generations of {total}")
