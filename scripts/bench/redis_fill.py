#!/usr/bin/env python3
"""Fills a Redis Cluster with key:0 .. key:<KEYS-1>, each written exactly once.

Raw RESP over one socket per primary (no client library): the keys are grouped by the primary
owning their slot (CLUSTER SLOTS) and sent in pipelined batches, every reply read and checked.
Prints one line: `redis_fill keys=N seconds=S errors=E`; exits 1 on any error.

usage: redis_fill.py PORT [--keys 1000000] [--value-size 100] [--batch 5000]
"""

import argparse
import socket
import sys
import time

from redis_wait_bench import command, read_reply, slot_map

# CRC16-CCITT (XMODEM) by table: the bitwise version in redis_wait_bench is too slow for
# millions of keys.
CRC_TABLE = []
for _byte in range(256):
    _crc = _byte << 8
    for _ in range(8):
        _crc = ((_crc << 1) ^ 0x1021) if _crc & 0x8000 else (_crc << 1)
    CRC_TABLE.append(_crc & 0xFFFF)


def slot_of(key: bytes) -> int:
    """Redis Cluster's slot of a key without hash tags (key:<n> has none)."""
    crc = 0
    for byte in key:
        crc = ((crc << 8) & 0xFFFF) ^ CRC_TABLE[((crc >> 8) ^ byte) & 0xFF]
    return crc % 16384


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("port", type=int)
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--value-size", type=int, default=100)
    parser.add_argument("--batch", type=int, default=5000)
    args = parser.parse_args()

    owners = slot_map(args.port)
    value = b"x" * args.value_size
    by_owner = {}
    for n in range(args.keys):
        key = b"key:%d" % n
        by_owner.setdefault(owners[slot_of(key)], []).append(key)

    start = time.monotonic()
    errors = 0
    for port, keys in by_owner.items():
        with socket.create_connection(("127.0.0.1", port)) as conn:
            reader = conn.makefile("rb")
            for at in range(0, len(keys), args.batch):
                batch = keys[at : at + args.batch]
                conn.sendall(b"".join(command(b"SET", key, value) for key in batch))
                for _ in batch:
                    reply = read_reply(reader)
                    if isinstance(reply, Exception) or reply != b"OK":
                        errors += 1
    seconds = time.monotonic() - start
    print(f"redis_fill keys={args.keys} seconds={seconds:.2f} errors={errors}")
    sys.exit(1 if errors else 0)


if __name__ == "__main__":
    main()
