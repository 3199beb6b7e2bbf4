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
	"sync"
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

// releaseBytes is the smallest buffer a socket gives back to its
// context's pool when a receive finds nothing queued. Live messages
// mostly fit in less and keep their buffer; a snapshot's reply batches
// do not, and a calibration round runs many snapshots at once, each of
// which would otherwise hold a batch's buffer while it waits for the
// engine's next one.
const releaseBytes = 64 << 10

// poolBuffers is how many given-back buffers a context keeps. Only the
// sockets whose owners are running at the moment hold one, so a few
// are enough for a process's sockets; a buffer given back past them is
// left to the collector.
const poolBuffers = 8

// PoolBytes bounds what a context's pool of receive buffers holds: at
// most poolBuffers buffers of at most frameRetainBytes each. It comes
// on top of each socket's own buffer (one message at most).
const PoolBytes = poolBuffers * frameRetainBytes

// bufferPool holds receive buffers that sockets gave back when they ran
// out of input, for the next socket that needs a large one.
type bufferPool struct {
	mu   sync.Mutex
	bufs [][]byte
}

// get takes a buffer of at least need bytes and, when limit is not 0,
// at most limit; nil when the pool has none.
func (p *bufferPool) get(need, limit int) []byte {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i, b := range p.bufs {
		if cap(b) >= need && (limit == 0 || cap(b) <= limit) {
			last := len(p.bufs) - 1
			p.bufs[i] = p.bufs[last]
			p.bufs[last] = nil
			p.bufs = p.bufs[:last]
			return b[:0]
		}
	}
	return nil
}

// put keeps b for a later get when there is room for it.
func (p *bufferPool) put(b []byte) {
	if cap(b) > frameRetainBytes {
		return
	}
	p.mu.Lock()
	if len(p.bufs) < poolBuffers {
		p.bufs = append(p.bufs, b[:0])
	}
	p.mu.Unlock()
}

// held is how many buffers the pool keeps, for tests.
func (p *bufferPool) held() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.bufs)
}

// frameReader receives whole messages into one buffer it reuses, so a
// message costs one cgo call and no allocation: pebbe/zmq4's receive
// makes a new slice for every frame (fresh memory, which the hundred
// megabytes of a 262,144-block snapshot fault in page by page) and asks
// libzmq for each frame and its "more" flag separately. A buffer of
// releaseBytes or more goes back to pool, when there is one, as soon as
// a receive finds nothing queued: its frames are no longer valid then.
type frameReader struct {
	msg  *C.kvt_msg
	buf  []byte
	pool *bufferPool
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
			// A buffer this large would go back to the pool at the next
			// empty receive, so one from the pool serves as well.
			if r.pool != nil && c >= releaseBytes {
				if b := r.pool.get(int(r.need), int(r.limit)); b != nil {
					r.buf = b
					continue
				}
			}
			r.buf = make([]byte, 0, c)
		case n == -3:
			return nil, ErrTooManyFrames
		case n == -4:
			return nil, fmt.Errorf("%w: %d bytes, over the %d allowed", ErrMessageTooLarge, r.need, r.limit)
		default:
			if e, ok := err.(syscall.Errno); ok {
				if e == syscall.EAGAIN {
					r.release()
				}
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

// drop frees parts still held for a larger buffer and gives the buffer
// back; the socket's owner calls it when it closes the socket.
func (r *frameReader) drop() {
	if r.msg != nil {
		C.kvt_drop(r.msg)
	}
	r.release()
	r.buf = nil
}

// release gives a buffer of releaseBytes or more back to the pool, when
// there is one; nothing refers to its frames any more.
func (r *frameReader) release() {
	if r.pool != nil && cap(r.buf) >= releaseBytes {
		r.pool.put(r.buf)
		r.buf = nil
	}
}
