#!/usr/bin/env python3
"""Abuse of ecokv serve's connections (loopback only, bounded in count and time).

    slow-clients.py PORT_SLOW TIMEOUT PORT_CAPPED CAP

- 200 connections to PORT_SLOW send a request header a byte every 0.3 s and never finish; while they do, /health
  and a real chat request must each answer within 2 s, long before the slow ones' deadline frees a starved server
  (TIMEOUT, at least 5 s: after TIMEOUT - 1 s here). They take 0.002-0.13 s; once 1.19 s on the 2-core machine beside
  the suite's other job and a training run, which the 1 s asked before failed on: a timing, not starvation. The server must close every one of them within its request
  deadline (TIMEOUT seconds) plus 2 s.
- A body shorter than its Content-Length: the connection is closed within the deadline plus 2 s.
- CAP + 10 idle connections to PORT_CAPPED: those past the cap are answered 503 (server_busy) and closed.
"""
import http.client
import json
import socket
import sys
import threading
import time

port_slow, timeout, port_capped, cap = (int(a) for a in sys.argv[1:5])
assert timeout >= 5, "a deadline of at least 5 s tells a starved server from a slow answer (see above)"
HEADER = b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 10000


def timed(port, method, path, body=None):
    t0 = time.monotonic()
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    c.request(method, path, body=body, headers={"Content-Type": "application/json"} if body else {})
    r = c.getresponse()
    data = r.read()
    c.close()
    return r.status, time.monotonic() - t0, data


def slow_clients(n, port, stop, closed_at, opened):
    socks = []
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", port))
        s.settimeout(0.01)
        socks.append(s)
    opened.set()
    t0, i = time.monotonic(), 0
    while not stop.is_set() and len(closed_at) < n:
        for k, s in enumerate(socks):
            if k in closed_at:
                continue
            try:
                s.send(HEADER[i:i + 1])
                if s.recv(1) == b"":
                    closed_at[k] = time.monotonic() - t0
            except socket.timeout:
                pass
            except OSError:
                closed_at[k] = time.monotonic() - t0
        i += 1
        time.sleep(0.3)
    for s in socks:
        s.close()


def main():
    stop, opened, closed_at = threading.Event(), threading.Event(), {}
    t = threading.Thread(target=slow_clients, args=(200, port_slow, stop, closed_at, opened))
    t.start()
    opened.wait()
    time.sleep(1.0)  # every slow client has sent a few bytes
    chat = json.dumps({"max_tokens": 4, "messages": [{"role": "user", "content": "What is the TOTAL?"}]})
    for what, (status, took, _) in (("/health", timed(port_slow, "GET", "/health")),
                                    ("a chat request", timed(port_slow, "POST", "/v1/chat/completions", chat))):
        assert status == 200 and took < 2.0, (what, status, took)
        print(f"ok - {what} answers in {took:.3f} s beside 200 slow connections")
    t.join(timeout + 10)
    stop.set()
    assert len(closed_at) == 200, f"{200 - len(closed_at)} slow connections still open"
    last = max(closed_at.values())
    assert last <= timeout + 2, f"the last slow connection was closed after {last:.1f} s"
    print(f"ok - all 200 slow connections closed by the server, the last after {last:.1f} s (deadline {timeout} s)")

    short = socket.create_connection(("127.0.0.1", port_slow))  # a Content-Length larger than the body sent
    short.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 100\r\n\r\n{\"messages\"")
    short.settimeout(timeout + 2)
    t0 = time.monotonic()
    try:
        answer = short.recv(4096)
    except socket.timeout:
        answer = None
    took = time.monotonic() - t0
    assert answer is not None and b" 200 " not in answer and took <= timeout + 2, (answer, took)
    print(f"ok - a body shorter than its Content-Length is dropped after {took:.1f} s")

    idle = [socket.create_connection(("127.0.0.1", port_capped)) for _ in range(cap + 10)]
    time.sleep(0.5)
    refused = 0
    for s in idle:
        s.settimeout(0.5)
        try:
            refused += b" 503 " in s.recv(4096)
        except socket.timeout:
            pass
        s.close()
    assert refused == 10, f"{refused} of {cap + 10} connections refused with a cap of {cap}"
    status, took, _ = timed(port_capped, "GET", "/health")
    assert status == 200, status
    print(f"ok - past --max-connections {cap}: the 10 extra connections answered 503, the server still serves")


main()
