#!/usr/bin/env python3
"""Redis Cluster writes at slotring's durability: every SET followed by WAIT 1 1000.

redis-benchmark cannot send a WAIT after each SET, so this is a small load generator with raw
RESP over sockets (no client library). CLIENTS connections in all, spread over PROCESSES
processes (Python threads share one interpreter lock, so processes keep the client from being
the bottleneck on its own); each connection loops until DURATION seconds have passed: pick
key:<n> uniformly from 0..KEYS-1, send `SET key value` and `WAIT 1 1000` in one write to the
primary owning the key's slot (from CLUSTER SLOTS), and read both replies. WAIT applies to the
writes this connection made before it, so sending both at once is the same as sending WAIT
after the SET's reply; the write counts as acknowledged when WAIT answers, and its latency runs
from the send to that answer. A WAIT answering 0 (no replica confirmed within 1000 ms) is
counted as not_replicated. Errors are counted, never raised.

Prints one line: `redis_wait ops=N writes_per_s=R p50_ms=A p99_ms=B p999_ms=C not_replicated=X
errors=E` (ops and writes_per_s count only writes WAIT confirmed on a replica).

usage: redis_wait_bench.py PORT [--clients 50] [--processes 5] [--duration 10] [--keys 100000]
                           [--value-size 100]
"""

import argparse
import multiprocessing
import random
import socket
import sys
import threading
import time


def crc16(data: bytes) -> int:
    """CRC16-CCITT (XMODEM), as Redis Cluster's key slot."""
    crc = 0
    for byte in data:
        crc ^= byte << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else (crc << 1)
            crc &= 0xFFFF
    return crc


def key_slot(key: bytes) -> int:
    start = key.find(b"{")
    if start >= 0:
        end = key.find(b"}", start + 1)
        if end > start + 1:
            key = key[start + 1 : end]
    return crc16(key) % 16384


def command(*parts: bytes) -> bytes:
    out = [b"*%d\r\n" % len(parts)]
    for part in parts:
        out.append(b"$%d\r\n%s\r\n" % (len(part), part))
    return b"".join(out)


def read_reply(reader):
    """One RESP reply: simple string, error, integer, bulk string or array."""
    line = reader.readline()
    if not line:
        raise ConnectionError("connection closed")
    kind, rest = line[:1], line[1:-2]
    if kind in (b"+", b":"):
        return rest
    if kind == b"-":
        return RuntimeError(rest.decode(errors="replace"))
    if kind == b"$":
        length = int(rest)
        if length < 0:
            return None
        data = reader.read(length + 2)
        return data[:-2]
    if kind == b"*":
        count = int(rest)
        return [read_reply(reader) for _ in range(max(count, 0))]
    raise ConnectionError(f"bad reply {line!r}")


def slot_map(port: int):
    """slot -> primary port, from CLUSTER SLOTS."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    reader = sock.makefile("rb")
    sock.sendall(command(b"CLUSTER", b"SLOTS"))
    ranges = read_reply(reader)
    sock.close()
    owner = [0] * 16384
    for entry in ranges:
        low, high, primary = int(entry[0]), int(entry[1]), entry[2]
        for slot in range(low, high + 1):
            owner[slot] = int(primary[1])
    return owner


def connection_loop(owner, args, deadline, seed, results, lock):
    rng = random.Random(seed)
    value = b"x" * args.value_size
    wait = command(b"WAIT", b"1", b"1000")
    conns = {}
    latencies = []
    not_replicated = errors = 0
    while time.monotonic() < deadline:
        key = b"key:%d" % rng.randrange(args.keys)
        port = owner[key_slot(key)]
        try:
            if port not in conns:
                sock = socket.create_connection(("127.0.0.1", port), timeout=5)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                conns[port] = (sock, sock.makefile("rb"))
            sock, reader = conns[port]
            began = time.perf_counter()
            sock.sendall(command(b"SET", key, value) + wait)
            set_reply = read_reply(reader)
            wait_reply = read_reply(reader)
            took = time.perf_counter() - began
        except (OSError, ConnectionError, ValueError):
            errors += 1
            conns.pop(port, None)
            continue
        if isinstance(set_reply, Exception) or isinstance(wait_reply, Exception):
            errors += 1
        elif int(wait_reply) < 1:
            not_replicated += 1
        else:
            latencies.append(took)
    for sock, _ in conns.values():
        sock.close()
    with lock:
        results["latencies"].extend(latencies)
        results["not_replicated"] += not_replicated
        results["errors"] += errors


def process_main(owner, args, deadline, threads, seed, queue):
    results = {"latencies": [], "not_replicated": 0, "errors": 0}
    lock = threading.Lock()
    workers = [
        threading.Thread(
            target=connection_loop,
            args=(owner, args, deadline, seed * 1000 + i, results, lock),
        )
        for i in range(threads)
    ]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    queue.put(results)


def percentile(sorted_values, q):
    if not sorted_values:
        return float("nan")
    rank = max(1, min(len(sorted_values), int(-(-q * len(sorted_values) // 1))))
    return sorted_values[rank - 1]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("port", type=int)
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--processes", type=int, default=5)
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--keys", type=int, default=100000)
    parser.add_argument("--value-size", type=int, default=100)
    args = parser.parse_args()
    if args.clients < 1 or args.processes < 1 or args.duration <= 0 or args.keys < 1:
        parser.error("clients, processes, keys must be >= 1 and duration > 0")

    owner = slot_map(args.port)
    processes = min(args.processes, args.clients)
    share = [args.clients // processes + (i < args.clients % processes) for i in range(processes)]
    queue = multiprocessing.Queue()
    started = time.monotonic()
    deadline = started + args.duration
    children = [
        multiprocessing.Process(
            target=process_main, args=(owner, args, deadline, share[i], i + 1, queue)
        )
        for i in range(processes)
    ]
    for child in children:
        child.start()
    latencies, not_replicated, errors = [], 0, 0
    for _ in children:
        part = queue.get()
        latencies.extend(part["latencies"])
        not_replicated += part["not_replicated"]
        errors += part["errors"]
    for child in children:
        child.join()
    elapsed = time.monotonic() - started
    latencies.sort()
    print(
        "redis_wait ops=%d writes_per_s=%.1f p50_ms=%.3f p99_ms=%.3f p999_ms=%.3f "
        "not_replicated=%d errors=%d elapsed_s=%.2f"
        % (
            len(latencies),
            len(latencies) / elapsed,
            percentile(latencies, 0.5) * 1000,
            percentile(latencies, 0.99) * 1000,
            percentile(latencies, 0.999) * 1000,
            not_replicated,
            errors,
            elapsed,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
