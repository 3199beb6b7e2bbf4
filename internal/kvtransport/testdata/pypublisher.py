"""A minimal engine-side KV event endpoint on libzmq (pyzmq), used to
check that the Go side interoperates with the real library: an XPUB for
live messages and a ROUTER answering replay requests.

Commands on stdin, one per line; each is answered on stdout:
  pub <topic> <seq> <hex payload>   -> "ok"
  quit                              -> exits
Events printed unprompted: "ready <xpub port> <router port>",
"subscribed <hex topic>" when a SUB subscribes, "replay <start seq>".
A replay request is answered with the frames given by the last
"snapshot <seq> <hex payload> ..." command, then the end marker.
"""
import binascii
import struct
import sys

import zmq

END = 0xFFFFFFFFFFFFFFFF


def main():
    xpub_ep, router_ep = sys.argv[1], sys.argv[2]
    ctx = zmq.Context()
    xpub = ctx.socket(zmq.XPUB)
    xpub.setsockopt(zmq.LINGER, 0)
    xpub.bind(xpub_ep)
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    router.bind(router_ep)

    def port(s):
        return s.getsockopt(zmq.LAST_ENDPOINT).decode().rsplit(":", 1)[1]

    out = sys.stdout
    out.write("ready %s %s\n" % (port(xpub), port(router)))
    out.flush()
    snapshot = []
    poller = zmq.Poller()
    poller.register(xpub, zmq.POLLIN)
    poller.register(router, zmq.POLLIN)
    poller.register(sys.stdin, zmq.POLLIN)
    while True:
        for sock, _ in poller.poll(1000):
            if sock is xpub:
                msg = xpub.recv()
                if msg[:1] == b"\x01":
                    out.write("subscribed %s\n" % binascii.hexlify(msg[1:]).decode())
                    out.flush()
            elif sock is router:
                frames = router.recv_multipart()
                ident, start = frames[0], struct.unpack(">Q", frames[2])[0]
                out.write("replay %d\n" % start)
                out.flush()
                for seq, payload in snapshot:
                    router.send_multipart([ident, b"", struct.pack(">Q", seq), payload])
                router.send_multipart([ident, b"", struct.pack(">Q", END), b""])
            else:
                line = sys.stdin.readline()
                if not line:
                    return
                parts = line.split()
                if parts[0] == "quit":
                    return
                if parts[0] == "pub":
                    topic = binascii.unhexlify(parts[1]) if parts[1] != "-" else b""
                    seq = int(parts[2])
                    payload = binascii.unhexlify(parts[3])
                    xpub.send_multipart([topic, struct.pack(">Q", seq), payload])
                elif parts[0] == "snapshot":
                    snapshot = []
                    rest = parts[1:]
                    for i in range(0, len(rest), 2):
                        snapshot.append((int(rest[i]), binascii.unhexlify(rest[i + 1])))
                out.write("ok\n")
                out.flush()


if __name__ == "__main__":
    main()
