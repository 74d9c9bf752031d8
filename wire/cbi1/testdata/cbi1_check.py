"""An independent CBI1 codec for wire/cbi1's interop test.

Written from the field tables of Dynamo's CBI1 README (docs/wire.md section 8)
with only struct and the xxhash package (Debian: python3-xxhash); it shares no
code with the Go package.

  decode   read one hex frame a line from stdin, print one JSON line each:
           the decoded fields (64-bit values as decimal strings) or
           {"ok": false, "reason": ...}
  encode   print JSON lines {"name", "hex", "frame"} of frames built here
"""
import json
import struct
import sys

import xxhash

HEADER = struct.Struct("<4sHHBBHQQQQI")  # 48 bytes
MAX_CHUNK = 512 * 1024
MAX_FRAME = 48 + 16 + MAX_CHUNK * 8
MAX_IMAGES = (MAX_FRAME - 48 - 12) // 12


def checksum(body):
    return xxhash.xxh3_64_intdigest(body) & 0xFFFFFFFF


def fail(reason):
    return {"ok": False, "reason": reason}


def decode(b):
    if len(b) < 48:
        return fail("truncated")
    if len(b) > MAX_FRAME:
        return fail("too_large")
    magic, wire, flags, bits, slots, fmt, seed, buckets, dc, epoch, cs = HEADER.unpack_from(b)
    if magic != b"CBI1":
        return fail("magic")
    if wire != 1:
        return fail("wire_version")
    body = b[48:]
    if checksum(body) != cs:
        return fail("checksum")
    if fmt != 1 or bits != 16 or slots != 4:
        return fail("format")
    if buckets < 2 or buckets > 1 << 24 or buckets & (buckets - 1):
        return fail("format")
    out = {"ok": True, "flags": flags, "seed": str(seed), "bucket_count": buckets,
           "dc_id": str(dc), "epoch": str(epoch)}
    if flags == 1:
        if len(body) < 16:
            return fail("malformed")
        index, count, offset = struct.unpack_from("<IIQ", body)
        if count == 0 or index >= count:
            return fail("malformed")
        raw = body[16:]
        if len(raw) % 8:
            return fail("malformed")
        n = len(raw) // 8
        if n > MAX_CHUNK:
            return fail("limit")
        if offset + n > buckets:
            return fail("malformed")
        out.update(chunk_index=index, chunk_count=count, bucket_offset=str(offset),
                   words=[str(w) for w in struct.unpack("<%dQ" % n, raw)])
        return out
    if flags == 2:
        if len(body) < 12:
            return fail("malformed")
        base, count = struct.unpack_from("<QI", body)
        if count > MAX_IMAGES:
            return fail("limit")
        if len(body) != 12 + 12 * count:
            return fail("malformed")
        images = []
        for i in range(count):
            bucket, word = struct.unpack_from("<IQ", body, 12 + 12 * i)
            if bucket >= buckets:
                return fail("malformed")
            images.append([bucket, str(word)])
        out.update(base_epoch=str(base), images=images)
        return out
    return fail("flags")


def frame(flags, seed, buckets, dc, epoch, body):
    return HEADER.pack(b"CBI1", 1, flags, 16, 4, 1, seed, buckets, dc, epoch, checksum(body)) + body


def encode():
    seed = 0xFEDCBA9876543210
    words = [(i * 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF for i in range(16)]
    yield "chunk", frame(1, seed, 16, 3, 9, struct.pack("<IIQ", 0, 1, 0) + struct.pack("<16Q", *words))
    images = [(15, 0xFFFFFFFFFFFFFFFF), (0, 1), (15, 2)]  # unsorted, with a repeat
    body = struct.pack("<QI", 8, len(images)) + b"".join(struct.pack("<IQ", b, w) for b, w in images)
    yield "delta", frame(2, seed, 16, 3, 9, body)
    yield "empty_delta", frame(2, seed, 2 ** 24, 2 ** 64 - 1, 2 ** 64 - 1, struct.pack("<QI", 2 ** 64 - 2, 0))


def main():
    if sys.argv[1:] == ["decode"]:
        for line in sys.stdin:
            print(json.dumps(decode(bytes.fromhex(line.strip()))), flush=True)
    elif sys.argv[1:] == ["encode"]:
        for name, b in encode():
            print(json.dumps({"name": name, "hex": b.hex(), "frame": decode(b)}))
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
