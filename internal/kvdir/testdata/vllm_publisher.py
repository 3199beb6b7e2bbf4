"""An independent vLLM-format KV event publisher for kvdir's interop test.

It is written here from the published format (../shared/spec/DIALECTS.md),
not from kvcar's encoder: batches are built as Python values and packed by
Debian's python3-msgpack, block hashes are sha256 digests chained over the
parent digest and the block's token ids, and the sockets are Debian's
python3-zmq (libzmq), as in vLLM's ZmqEventPublisher:

  * a PUB socket that binds the given endpoint, or connects to it when
    the first argument is "connect" (vLLM connects when the host is not a
    wildcard);
  * optionally a ROUTER that answers [b"", start_seq] with every buffered
    batch from start_seq on, then the end marker; with "topic-frames" the
    replies carry the topic and the end marker an empty topic frame, as
    vLLM 0.26 and later send them.

Usage: vllm_publisher.py bind|connect <pub endpoint> <router endpoint or ->
       <topic or -> <block size> <buffer steps> [topic-frames]

Commands on stdin, one per line, each answered "ok" on stdout:
  store <token> <token> ...   store the prompt's full blocks (reusing the
                              cached prefix), one batch
  evict <token> <token> ...   remove the prompt's last full block, one batch
  clear                       AllBlocksCleared, one batch
  quit
Printed unprompted: "ready <pub port> <router port or 0>",
"subscribed" when a subscriber's subscription arrives.
"""
import hashlib
import struct
import sys
import time

import msgpack
import zmq

END = b"\xff" * 8


def block_hashes(tokens, block_size):
    """sha256 chain over parent digest and token ids, one per full block."""
    out, parent = [], b"\x00" * 32
    for i in range(len(tokens) // block_size):
        block = tokens[i * block_size:(i + 1) * block_size]
        parent = hashlib.sha256(parent + b"".join(struct.pack("<i", t) for t in block)).digest()
        out.append(parent)
    return out


def main():
    mode, pub_ep, router_ep, topic = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
    block_size, buffer_steps = int(sys.argv[5]), int(sys.argv[6])
    topic_frames = len(sys.argv) > 7 and sys.argv[7] == "topic-frames"
    topic = b"" if topic == "-" else topic.encode()
    ctx = zmq.Context()
    # An XPUB behaves as vLLM's PUB on the wire and also tells when a
    # subscription arrives, so the test knows the link is up.
    pub = ctx.socket(zmq.XPUB)
    pub.setsockopt(zmq.LINGER, 0)
    pub.setsockopt(zmq.SNDHWM, 100000)
    if mode == "bind":
        pub.bind(pub_ep)
    else:
        pub.connect(pub_ep)
    router = None
    if router_ep != "-":
        router = ctx.socket(zmq.ROUTER)
        router.setsockopt(zmq.LINGER, 0)
        router.bind(router_ep)

    def port(s):
        if s is None:
            return "0"
        return s.getsockopt(zmq.LAST_ENDPOINT).decode().rsplit(":", 1)[1]

    out = sys.stdout
    out.write("ready %s %s\n" % (port(pub) if mode == "bind" else "0", port(router)))
    out.flush()

    seq = 0
    history = []  # (seq, payload), at most buffer_steps
    cached = set()

    def publish(events):
        nonlocal seq
        payload = msgpack.packb([time.time(), events, 0], use_bin_type=True)
        pub.send_multipart([topic, struct.pack(">Q", seq), payload])
        history.append((seq, payload))
        del history[:-buffer_steps]
        seq += 1

    poller = zmq.Poller()
    poller.register(pub, zmq.POLLIN)
    if router is not None:
        poller.register(router, zmq.POLLIN)
    poller.register(sys.stdin, zmq.POLLIN)
    while True:
        for sock, _ in poller.poll(1000):
            if sock is pub:
                if pub.recv()[:1] == b"\x01":
                    out.write("subscribed\n")
                    out.flush()
            elif sock is router:
                frames = router.recv_multipart()
                ident, start = frames[0], struct.unpack(">Q", frames[2])[0]
                for s, payload in history:
                    if s >= start:
                        head = [ident, b"", topic] if topic_frames else [ident, b""]
                        router.send_multipart(head + [struct.pack(">Q", s), payload])
                router.send_multipart(([ident, b"", b""] if topic_frames else [ident, b""]) + [END, b""])
            else:
                line = sys.stdin.readline()
                if not line:
                    return
                parts = line.split()
                cmd, tokens = parts[0], [int(t) for t in parts[1:]]
                if cmd == "quit":
                    return
                if cmd == "store":
                    hashes = block_hashes(tokens, block_size)
                    n = 0
                    while n < len(hashes) and hashes[n] in cached:
                        n += 1
                    if n < len(hashes):
                        publish([{
                            "type": "BlockStored",
                            "block_hashes": hashes[n:],
                            "parent_block_hash": hashes[n - 1] if n > 0 else None,
                            "token_ids": tokens[n * block_size:len(hashes) * block_size],
                            "block_size": block_size,
                            "lora_id": None,
                            "medium": "GPU",
                            "lora_name": None,
                            "extra_keys": [None] * (len(hashes) - n),
                            "group_idx": 0,
                            "kv_cache_spec_kind": "full_attention",
                        }])
                        cached.update(hashes[n:])
                elif cmd == "evict":
                    last = block_hashes(tokens, block_size)[-1]
                    cached.discard(last)
                    publish([{"type": "BlockRemoved", "block_hashes": [last], "medium": "GPU"}])
                elif cmd == "clear":
                    cached.clear()
                    publish([{"type": "AllBlocksCleared"}])
                out.write("ok\n")
                out.flush()


if __name__ == "__main__":
    main()
