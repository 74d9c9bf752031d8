#!/usr/bin/python3
"""A vLLM-format KV-event publisher (pyzmq + msgpack, from vLLM's
vllm/distributed/kv_events.py wire format, sharing no code with the relay)
that connects its PUB socket to a relay's bound ZMQ source and publishes one
fresh root block per batch until stdin closes or LIMIT batches are sent.

usage: pyzmq_engine.py ENDPOINT BLOCK_SIZE INTERVAL_S LIMIT
"""
import random
import sys
import threading
import time

import msgpack
import zmq

ep, block_size, interval, limit = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
ctx = zmq.Context.instance()
pub = ctx.socket(zmq.PUB)
pub.connect(ep)
rng = random.Random(11)
stop = threading.Event()


def watch_stdin():
    sys.stdin.read()
    stop.set()


threading.Thread(target=watch_stdin, daemon=True).start()
print("ready", flush=True)
seq = 0
while not stop.is_set() and seq < limit:
    h = rng.getrandbits(63) | 1
    tokens = [rng.randrange(100000) for _ in range(block_size)]
    ev = ["BlockStored", [h], None, tokens, block_size, None, "GPU", None, None, 0, "full_attention", None]
    payload = msgpack.packb([time.time(), [ev], 0], use_bin_type=True)
    pub.send_multipart([b"", seq.to_bytes(8, "big"), payload])
    seq += 1
    time.sleep(interval)
print("sent", seq, flush=True)
