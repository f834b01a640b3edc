#!/usr/bin/env python3
"""The kernel's floor under a watch fan-out: the sender's CPU per send() of SIZE bytes to each of N
loopback TCP connections whose reader (another process, on another core) waits in epoll, as watch
clients do. A proxy that delivers an event to N clients makes at least one such send per client;
on loopback the kernel also charges the receiving side's TCP work and wake-up to the sender.

    send-floor.py N ROUNDS SIZE SENDER_CORE READER_CORE OUT.json

Bounded: N connections, ROUNDS rounds of one send each, 20 ms apart."""
import json
import os
import resource
import select
import socket
import sys
import time

n, rounds, size, sender_core, reader_core = (int(a) for a in sys.argv[1:6])
out = sys.argv[6]
listener = socket.socket()
listener.bind(("127.0.0.1", 0))
listener.listen(4096)
port = listener.getsockname()[1]
ready_r, ready_w = os.pipe()
reader = os.fork()
if reader == 0:
    os.sched_setaffinity(0, {reader_core})
    conns = [socket.create_connection(("127.0.0.1", port)) for _ in range(n)]
    poll = select.epoll()
    by_fd = {}
    for c in conns:
        c.setblocking(False)
        poll.register(c.fileno(), select.EPOLLIN)
        by_fd[c.fileno()] = c
    os.write(ready_w, b"x")
    total, deadline = 0, time.monotonic() + 60 + rounds
    while total < n * rounds * size and time.monotonic() < deadline:
        for fd, _ in poll.poll(1):
            try:
                total += len(by_fd[fd].recv(65536))
            except BlockingIOError:
                pass
    os._exit(0)
os.sched_setaffinity(0, {sender_core})
senders = []
for _ in range(n):
    c, _ = listener.accept()
    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    senders.append(c)
os.read(ready_r, 1)
payload = b"x" * size
before = resource.getrusage(resource.RUSAGE_SELF)
for _ in range(rounds):
    for c in senders:
        c.sendall(payload)
    time.sleep(0.02)
after = resource.getrusage(resource.RUSAGE_SELF)
os.waitpid(reader, 0)
sends = n * rounds
user = (after.ru_utime - before.ru_utime) / sends * 1e6
system = (after.ru_stime - before.ru_stime) / sends * 1e6
result = {"connections": n, "sends": sends, "bytes": size, "user_us_per_send": user,
          "sys_us_per_send": system, "cpu_us_per_send": user + system}
json.dump(result, open(out, "w"), indent=1)
print(f"send floor: {n} connections, {sends} sends of {size} B: {user + system:.2f} us per send "
      f"({system:.2f} in the kernel, {user:.2f} in Python)")
