package kvtransport

/*
#cgo !windows pkg-config: libzmq
#include <zmq.h>
#include <errno.h>
#include <string.h>

#define KVT_MAX_PARTS 16

// kvt_msg holds the parts of one message between the call that received
// them and the call that copies them, when the caller's buffer was too
// small for them.
typedef struct {
	zmq_msg_t part[KVT_MAX_PARTS];
	int n;
} kvt_msg;

// kvt_recv_part receives one part, again when a signal interrupted
// libzmq's look at its mailbox: the Go runtime's signals reach a thread
// in any call.
static int kvt_recv_part(zmq_msg_t *p, void *sock) {
	int rc;
	do {
		rc = zmq_msg_recv(p, sock, ZMQ_DONTWAIT);
	} while (rc < 0 && errno == EINTR);
	return rc;
}

static void kvt_drop(kvt_msg *m) {
	for (int i = 0; i < m->n; i++) zmq_msg_close(&m->part[i]);
	m->n = 0;
}

// kvt_recv receives one whole multipart message without waiting and
// copies its parts one after another into buf, their sizes into lens. It
// returns the number of parts, -1 with errno set when nothing could be
// received, -2 with *need set when the parts (kept in m for the next
// call) do not fit in cap bytes, -3 when the message had more than
// KVT_MAX_PARTS parts and -4 with *need set when its parts add up to more
// than limit bytes (limit 0: no limit); in both cases it was dropped.
static int kvt_recv(void *sock, kvt_msg *m, unsigned char *buf, size_t cap, size_t limit, size_t *lens, size_t *need) {
	if (m->n == 0) {
		for (;;) {
			if (m->n == KVT_MAX_PARTS) {
				// libzmq delivers a message's parts together, so the rest
				// are queued already.
				zmq_msg_t rest;
				int more = 1;
				while (more) {
					zmq_msg_init(&rest);
					if (kvt_recv_part(&rest, sock) < 0) more = 0;
					else more = zmq_msg_more(&rest);
					zmq_msg_close(&rest);
				}
				kvt_drop(m);
				return -3;
			}
			zmq_msg_t *p = &m->part[m->n];
			zmq_msg_init(p);
			if (kvt_recv_part(p, sock) < 0) {
				int e = errno;
				zmq_msg_close(p);
				kvt_drop(m);
				errno = e;
				return -1;
			}
			m->n++;
			if (!zmq_msg_more(p)) break;
		}
	}
	size_t total = 0;
	for (int i = 0; i < m->n; i++) total += zmq_msg_size(&m->part[i]);
	if (limit > 0 && total > limit) {
		kvt_drop(m);
		*need = total;
		return -4;
	}
	if (total > cap) {
		*need = total;
		return -2;
	}
	size_t off = 0;
	for (int i = 0; i < m->n; i++) {
		size_t sz = zmq_msg_size(&m->part[i]);
		if (sz > 0) memcpy(buf + off, zmq_msg_data(&m->part[i]), sz);
		lens[i] = sz;
		off += sz;
	}
	int n = m->n;
	kvt_drop(m);
	return n;
}
*/
import "C"

import (
	"errors"
	"fmt"
	"reflect"
	"syscall"
	"unsafe"

	zmq "github.com/pebbe/zmq4"
)

// maxFrames bounds the frames of one received message. KV event messages
// have two or three (topic, sequence, payload; a replay reply its
// sequence and payload); a message with more is dropped whole.
const maxFrames = C.KVT_MAX_PARTS

// ErrTooManyFrames reports a message of more than 16 frames, which no KV
// event channel sends. The message was dropped.
var ErrTooManyFrames = errors.New("kvtransport: message of more than 16 frames")

// ErrMessageTooLarge reports a message whose frames add up to more than
// its socket's max message bytes and FrameSlack. The message was dropped.
var ErrMessageTooLarge = errors.New("kvtransport: message too large")

// FrameSlack is what a message's frames besides its payload (topic,
// sequence, delimiter) may add to max message bytes. libzmq bounds each
// frame but not their number, so the receive bounds their sum: a socket's
// buffer never holds more than max message bytes and FrameSlack.
const FrameSlack = 64 << 10

// frameRetainBytes is the receive buffer a socket keeps between
// messages. A snapshot reply batch (512 blocks of 128 ids) and every
// live message of a decode step fit; a buffer grown past it by a rare
// larger message is dropped at the next receive, so that a stream does
// not hold it for good.
const frameRetainBytes = 1 << 20

// frameReader receives whole messages into one buffer it reuses, so a
// message costs one cgo call and no allocation: pebbe/zmq4's receive
// makes a new slice for every frame (fresh memory, which the hundred
// megabytes of a 262,144-block snapshot fault in page by page) and asks
// libzmq for each frame and its "more" flag separately.
type frameReader struct {
	msg *C.kvt_msg
	buf []byte
	// limit bounds a message's frames together; 0 means no bound.
	limit  int64
	need   C.size_t
	lens   [maxFrames]C.size_t
	frames [maxFrames][]byte
}

// socketHandle is where pebbe/zmq4's Socket keeps libzmq's socket
// pointer. v1.4.0 has no accessor for it, so it is found by reflection,
// checked by name and type; handleOK is false when a later version
// changed the struct, and then receives go through pebbe/zmq4's own.
var socketHandle, handleOK = func() (uintptr, bool) {
	f, ok := reflect.TypeFor[zmq.Socket]().FieldByName("soc")
	if !ok || f.Type != reflect.TypeFor[unsafe.Pointer]() {
		return 0, false
	}
	return f.Offset, true
}()

func handle(s *zmq.Socket) unsafe.Pointer {
	return *(*unsafe.Pointer)(unsafe.Add(unsafe.Pointer(s), socketHandle))
}

// recv receives one message from sock without waiting. The frames it
// returns live in the reader's buffer: they are valid until its next
// recv or drop. Errors are pebbe/zmq4's (zmq.Errno), so EAGAIN means
// nothing was queued.
func (r *frameReader) recv(sock *zmq.Socket) ([][]byte, error) {
	if !handleOK {
		return sock.RecvMessageBytes(zmq.DONTWAIT)
	}
	if r.msg == nil {
		r.msg = new(C.kvt_msg)
	}
	if cap(r.buf) > frameRetainBytes {
		r.buf = nil
	}
	for {
		var bp *C.uchar
		if cap(r.buf) > 0 {
			bp = (*C.uchar)(unsafe.Pointer(unsafe.SliceData(r.buf[:cap(r.buf)])))
		}
		n, err := C.kvt_recv(handle(sock), r.msg, bp, C.size_t(cap(r.buf)), C.size_t(r.limit), &r.lens[0], &r.need)
		switch {
		case n > 0:
			buf, off := r.buf[:cap(r.buf)], 0
			for i := range int(n) {
				l := int(r.lens[i])
				r.frames[i] = buf[off : off+l : off+l]
				off += l
			}
			return r.frames[:n], nil
		case n == -2:
			// The parts wait in r.msg while the buffer grows.
			c := max(int(r.need), min(max(2*cap(r.buf), 4<<10), frameRetainBytes))
			if r.limit > 0 {
				c = min(c, int(r.limit))
			}
			r.buf = make([]byte, 0, c)
		case n == -3:
			return nil, ErrTooManyFrames
		case n == -4:
			return nil, fmt.Errorf("%w: %d bytes, over the %d allowed", ErrMessageTooLarge, r.need, r.limit)
		default:
			if e, ok := err.(syscall.Errno); ok {
				return nil, zmq.Errno(e)
			}
			return nil, fmt.Errorf("kvtransport: receive failed without an errno (%v)", err)
		}
	}
}

// setMaxMessage has libzmq drop the connection of a peer sending a frame
// over n bytes, and the receive drop a message whose frames add up to
// more than n and FrameSlack.
func (s *watched) setMaxMessage(n int64) error {
	if err := s.SetMaxmsgsize(n); err != nil {
		return err
	}
	s.fr.limit = n + FrameSlack
	return nil
}

// drop frees parts still held for a larger buffer; the socket's owner
// calls it when it closes the socket.
func (r *frameReader) drop() {
	if r.msg != nil {
		C.kvt_drop(r.msg)
	}
	r.buf = nil
}
