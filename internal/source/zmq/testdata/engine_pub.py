#!/usr/bin/python3
"""An engine KV-event publisher written from the engines' own wire format
(vLLM vllm/distributed/kv_events.py; SGLang's map-tagged events), sharing no
code with the relay. Used by the relay's interop test.

usage: engine_pub.py PUB_ENDPOINT REPLAY_ENDPOINT BLOCK_SIZE FORM LAYOUT [BATCH [HASH]]
  FORM   array (msgspec array_like, tag first) | map (tagged under "type")
  LAYOUT old ([seq, payload] replies) | new ([topic, seq, payload] replies,
         and a publisher_id as the batch's 4th element)
  BATCH  array ([ts, events, dp_rank, ...], default) | map ({"ts", "events",
         "data_parallel_rank"}, as vLLM 0181ea3173e5 sends it)
  HASH   standard (default: flat token ids; one Eagle chain the relay must
         drop) | eagle (an Eagle engine: every chain's token ids are bigrams)
The scenario also publishes the variants today's engines send: a cache
namespace (map: top-level cache_salt as SGLang; array: Dynamo's tagged
extra_keys[0] string as vLLM), multimodal (id, offset) extra_keys in Dynamo's
marker form, a hybrid
model's sliding-window group, Eagle bigram token ids and an unknown medium.
stdin commands: "go" publishes the scenario (one batch is buffered for replay
but not sent), "truth" prints the GPU blocks held as JSON, "quit" exits.
"""
import json
import os
import random
import sys
import threading
import time

import msgpack
import zmq

pub_ep, replay_ep, block_size, form, layout = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5]
batch_form = sys.argv[6] if len(sys.argv) > 6 else "array"
hash_format = sys.argv[7] if len(sys.argv) > 7 else "standard"
topic = b"kv-events"
ctx = zmq.Context.instance()
pub = ctx.socket(zmq.PUB)
pub.bind(pub_ep)
router = ctx.socket(zmq.ROUTER)
router.bind(replay_ep)
lock = threading.Lock()
seq = 0
buffer = []  # (seq, payload)
publisher_id = os.urandom(16)
held = {}  # hash (unsigned) -> {"parent": int|None, "tokens": [...], "lora": str|None}
rng = random.Random(7)
running = True


def batch(events):
    if batch_form == "map":
        b = {"ts": time.time(), "events": events, "data_parallel_rank": 0}
        if layout == "new":
            b["publisher_id"] = publisher_id
        return msgpack.packb(b, use_bin_type=True)
    b = [time.time(), events, 0]
    if layout == "new":
        b.append(publisher_id)
    return msgpack.packb(b, use_bin_type=True)


def publish(events, send=True):
    global seq
    with lock:
        payload = batch(events)
        buffer.append((seq, payload))
        if send:
            pub.send_multipart([topic, seq.to_bytes(8, "big"), payload])
        seq += 1


def as_wire(h, how):
    """A block hash as an engine may send it."""
    if how == "int":
        return h
    if how == "neg":
        return h - (1 << 64) if h >= 1 << 63 else h
    return os.urandom(24) + h.to_bytes(8, "big")  # a digest: its last 8 bytes


def stored(hashes, parent, tokens, how, lora=None, medium="GPU", size=None, ns=None, mm=None,
           group=0, kind="full_attention"):
    size = size or block_size
    hs = [as_wire(h, how) for h in hashes]
    par = None if parent is None else as_wire(parent, how)
    extra = None
    if mm is not None:  # one (identifier, start_offset) list per block
        extra = [[[i, 0] for i in ids] if ids else None for ids in mm]
    if ns is not None and form != "map":  # vLLM: Dynamo's tag in the first block's extra_keys
        extra = extra or [None] * len(hashes)
        extra[0] = (extra[0] or []) + ["dynamo-cache-salt:" + ns]
    if form == "map":
        ev = {"type": "BlockStored", "block_hashes": hs, "parent_block_hash": par, "token_ids": tokens,
              "block_size": size, "lora_id": None, "medium": medium, "lora_name": lora,
              "extra_keys": extra, "group_idx": group, "kv_cache_spec_kind": kind}
        if ns is not None:  # SGLang / TensorRT-LLM: top-level cache_salt
            ev["cache_salt"] = ns
        return ev
    return ["BlockStored", hs, par, tokens, size, None, medium, lora, extra, group, kind, None]


def removed(hashes, how):
    hs = [as_wire(h, how) for h in hashes]
    if form == "map":
        return {"type": "BlockRemoved", "block_hashes": hs, "medium": "GPU", "group_idx": 0}
    return ["BlockRemoved", hs, "GPU", 0]


def chain(n, parent, how, lora=None, medium="GPU", send=True, keep=True, ns=None, inherit=None, mm=None,
          group=0, kind="full_attention", eagle=False):
    """Publishes one BlockStored of n blocks; held (the truth) records what a
    router should find: each block's token window, LoRA, namespace (ns, or
    inherit: the namespace a parent-chain propagation gives) and mm hashes
    (a marker identifier's first 16 hex digits)."""
    eagle = eagle or hash_format == "eagle"
    if eagle and hash_format != "eagle":
        keep = False  # bigrams into a standard pool: dropped (hash_format)
    hashes = [rng.getrandbits(64) | (1 << 63 if how == "neg" else 1) for _ in range(n)]
    flat = [rng.randrange(100000) for _ in range(n * block_size + (1 if eagle else 0))]
    tokens = [[flat[i], flat[i + 1]] for i in range(len(flat) - 1)] if eagle else flat
    publish([stored(hashes, parent, tokens, how, lora, medium, ns=ns, mm=mm, group=group, kind=kind)], send)
    if keep and medium == "GPU":
        p = parent
        w = block_size + (1 if eagle else 0)
        for i, h in enumerate(hashes):
            ids = (mm[i] if mm else None) or []
            held[h] = {"parent": p, "tokens": flat[i * block_size:i * block_size + w], "lora": lora,
                       "ns": ns or inherit, "mm": [int(x[:16], 16) for x in ids]}
            p = h
    return hashes


def hexid():
    """A multimodal identifier as a Dynamo worker hands it to vLLM when the
    frontend approved exact multimodal routing: the routing hash as 16 hex
    digits, then 48 zeros (Dynamo's marker form; vLLM's own 64-hex digests
    are not routing keys)."""
    return "%016x" % rng.getrandbits(64) + "0" * 48


def scenario():
    a = chain(3, None, "int")
    b = chain(2, a[2], "bytes")
    chain(2, None, "neg", send=False)  # lost on the wire: only the replay has it
    chain(1, None, "int", lora="adapter-x")
    chain(1, None, "int", medium="CPU")
    # A block of another size is dropped by the relay.
    publish([stored([rng.getrandbits(64)], None, [1] * (block_size * 2), "int", size=block_size * 2)])
    publish([removed([b[1]], "bytes")])
    del held[b[1]]
    # Today's engines' variants.
    s = chain(2, None, "int", ns="tenant-a")
    chain(1, s[1], "int", inherit="tenant-a")  # no namespace of its own: its parent's
    chain(2, None, "int", mm=[[hexid()], [hexid(), hexid()]])
    chain(1, None, "int", group=1, kind="sliding_window", keep=False)  # a hybrid model's other group
    chain(1, None, "int", group=1, kind=None, keep=False)  # the same group, kind learned
    chain(1, None, "int", medium="OBJ", keep=False)  # unknown medium: fail closed
    chain(2, None, "int", eagle=True)  # Eagle bigram token ids: kept only by an Eagle pool


def heartbeats():
    while running:
        publish([])
        time.sleep(0.02)


def serve_replay():
    poller = zmq.Poller()
    poller.register(router, zmq.POLLIN)
    while running:
        if not poller.poll(50):
            continue
        frames = router.recv_multipart()
        if len(frames) != 3:
            continue
        client, _, start = frames
        start = int.from_bytes(start, "big")
        with lock:
            items = [(s, p) for s, p in buffer if s >= start]
        for s, p in items:
            if layout == "new":
                router.send_multipart([client, b"", topic, s.to_bytes(8, "big"), p])
            else:
                router.send_multipart([client, b"", s.to_bytes(8, "big"), p])
        end = (-1).to_bytes(8, "big", signed=True)
        if layout == "new":
            router.send_multipart([client, b"", b"", end, b""])
        else:
            router.send_multipart([client, b"", end, b""])


threading.Thread(target=serve_replay, daemon=True).start()
threading.Thread(target=heartbeats, daemon=True).start()
print("ready", flush=True)
for line in sys.stdin:
    cmd = line.strip()
    if cmd == "go":
        scenario()
        print("done", seq, flush=True)
    elif cmd == "truth":
        print(json.dumps({str(h): v for h, v in held.items()}), flush=True)
    elif cmd == "quit":
        break
running = False
time.sleep(0.1)
pub.close(linger=0)
router.close(linger=0)
