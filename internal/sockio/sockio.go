package sockio

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"syscall"
	"unsafe"
)

// Conn reads and writes a TCP connection with raw system calls on its
// non-blocking socket, waiting in the runtime's poller (and under the
// connection's deadlines) only when the socket has nothing to give or no
// room. A read or write through net.Conn enters the scheduler's syscall
// state, and when every P has been idle, as between requests at one
// client, that entry wakes the runtime's monitor thread: a futex wake-up
// per system call, a tenth of a relay's CPU at one client. A non-blocking
// call on a socket returns in microseconds, so it need not tell the
// scheduler. Connections that are not sockets go through net.Conn.
type Conn struct {
	conn net.Conn
	// raw is nil when conn is not a socket.
	raw syscall.RawConn
	// The callbacks are made once; these carry their arguments and
	// results.
	readFn, writeFn, sendFn, takeFn func(fd uintptr) bool
	sent                            bool
	take                            func() []byte
	giveBack                        func()
	p                               []byte
	bufs                            [][]byte
	one                             [1][]byte
	iov                             []syscall.Iovec
	n                               int
	errno                           syscall.Errno
}

// New returns conn's raw I/O. conn is still the one to close and to set
// deadlines on; the reads and writes here keep to them.
func New(conn net.Conn) *Conn {
	s := &Conn{conn: conn}
	if sc, ok := conn.(syscall.Conn); ok {
		if raw, err := sc.SyscallConn(); err == nil {
			s.raw = raw
		}
	}
	s.readFn, s.writeFn, s.sendFn, s.takeFn = s.read, s.write, s.send, s.readTaken
	return s
}

// Raw is the connection's raw access, nil when it is not a socket.
func (s *Conn) Raw() syscall.RawConn { return s.raw }

// Read reads into p, as net.Conn's Read.
func (s *Conn) Read(p []byte) (int, error) {
	if s.raw == nil {
		return s.conn.Read(p)
	}
	if len(p) == 0 {
		return 0, nil
	}
	s.p, s.n, s.errno = p, 0, 0
	err := s.readErr(s.raw.Read(s.readFn))
	s.p = nil
	if err != nil {
		return 0, err
	}
	return s.n, nil
}

// readErr is the error of a raw read that ended with err: err itself,
// the read's own error, or io.EOF when it read nothing.
func (s *Conn) readErr(err error) error {
	switch {
	case err != nil:
		return err
	case s.errno != 0:
		return os.NewSyscallError("read", s.errno)
	case s.n == 0:
		return io.EOF
	}
	return nil
}

// ReadTaken reads into a buffer that take hands out for the attempt, and
// returns it with what was read: a connection waiting for input holds no
// buffer of its own, as the buffer goes back through giveBack before each
// wait, and again when the read fails or finds the end of the stream
// (then buf is nil). The callbacks are the caller's, set once (SetTake).
func (s *Conn) ReadTaken() (buf []byte, n int, err error) {
	if s.raw == nil {
		buf = s.take()
		if n, err = s.conn.Read(buf); n == 0 {
			s.giveBack()
			buf = nil
		}
		return buf, n, err
	}
	s.p, s.n, s.errno = nil, 0, 0
	err = s.readErr(s.raw.Read(s.takeFn))
	buf, s.p = s.p, nil
	if err != nil {
		if buf != nil {
			s.giveBack()
		}
		return nil, 0, err
	}
	return buf, s.n, nil
}

// SetTake sets the callbacks ReadTaken takes a buffer from and gives the
// buffer it took last back to.
func (s *Conn) SetTake(take func() []byte, giveBack func()) {
	s.take, s.giveBack = take, giveBack
}

// readTaken is ReadTaken's raw read: the buffer is taken for the
// attempt and given back when the socket has nothing, before the wait.
func (s *Conn) readTaken(fd uintptr) bool {
	if s.p == nil {
		s.p = s.take()
	}
	if !s.read(fd) {
		s.giveBack()
		s.p = nil
		return false
	}
	return true
}

// read is the raw read: false (wait for the socket) when it would block.
func (s *Conn) read(fd uintptr) bool {
	for {
		n, _, e := syscall.RawSyscall(syscall.SYS_READ, fd, uintptr(unsafe.Pointer(&s.p[0])), uintptr(len(s.p)))
		switch e {
		case syscall.EINTR:
			continue
		case syscall.EAGAIN:
			return false
		}
		s.n, s.errno = int(n), e
		return true
	}
}

// Write writes p whole.
func (s *Conn) Write(p []byte) (int, error) {
	if s.raw == nil {
		return s.conn.Write(p)
	}
	s.one[0] = p
	s.bufs = s.one[:]
	return s.writeBuffers()
}

// Writev writes bufs whole, in one system call when the socket has room.
// bufs is consumed.
func (s *Conn) Writev(bufs [][]byte) (int, error) {
	if s.raw == nil {
		nb := net.Buffers(bufs)
		n, err := nb.WriteTo(s.conn)
		return int(n), err
	}
	s.bufs = bufs
	return s.writeBuffers()
}

func (s *Conn) writeBuffers() (int, error) {
	s.n, s.errno = 0, 0
	err := s.raw.Write(s.writeFn)
	s.dropBuffers()
	if err == nil && s.errno != 0 {
		err = os.NewSyscallError("writev", s.errno)
	}
	return s.n, err
}

// dropBuffers lets go of what a write was given, so that the Conn keeps
// no reference to the caller's buffers.
func (s *Conn) dropBuffers() {
	clear(s.bufs)
	s.bufs = nil
	s.one[0] = nil
	clear(s.iov)
}

// ErrWaiting wraps what ended Send's wait for the answer after the
// request was written whole: a deadline, or the connection closed.
var ErrWaiting = errors.New("waiting for the answer")

// Send writes bufs whole and then waits until the socket has something
// to read, for a request whose answer the peer sends only once it has
// read all of it. Where a Write and then a Read would try the read at
// once, and find nothing so soon after the request, Send starts waiting
// without that system call: the wait is armed before the write, so no
// answer can come before it. An error from the write is returned as it
// is; one from the wait wraps ErrWaiting. bufs is consumed.
func (s *Conn) Send(bufs [][]byte) (int, error) {
	if s.raw == nil {
		return s.Writev(bufs)
	}
	s.bufs, s.sent = bufs, false
	s.n, s.errno = 0, 0
	err := s.raw.Read(s.sendFn)
	written, errno := s.n, s.errno
	full := len(s.bufs) == 0
	if err == nil && errno == 0 && !full {
		// The socket had no room for all of it: the rest waits for room
		// as a Write's does.
		var n int
		n, err = s.writeBuffers()
		return written + n, err
	}
	s.dropBuffers()
	switch {
	case errno != 0:
		return written, os.NewSyscallError("writev", errno)
	case err != nil && s.sent:
		return written, fmt.Errorf("%w: %w", ErrWaiting, err)
	}
	return written, err
}

// send is Send's raw callback: the RawConn's Read calls it once the
// wait for input is armed, and again each time the socket may have
// some. The first call writes; true ends the Read.
func (s *Conn) send(fd uintptr) bool {
	if s.sent {
		return true
	}
	s.sent = true
	if !s.write(fd) {
		return true // short of room: Send writes the rest
	}
	return s.errno != 0 || len(s.bufs) != 0
}

// maxIovecs bounds one writev's vector, under the kernel's IOV_MAX.
const maxIovecs = 1024

// write is the raw writev of what is left of s.bufs: false (wait for
// room) when the socket is full.
func (s *Conn) write(fd uintptr) bool {
	for {
		s.iov = s.iov[:0]
		for _, b := range s.bufs {
			if len(b) > 0 && len(s.iov) < maxIovecs {
				v := syscall.Iovec{Base: &b[0]}
				v.SetLen(len(b))
				s.iov = append(s.iov, v)
			}
		}
		if len(s.iov) == 0 {
			return true
		}
		n, _, e := syscall.RawSyscall(syscall.SYS_WRITEV, fd, uintptr(unsafe.Pointer(&s.iov[0])), uintptr(len(s.iov)))
		switch e {
		case 0:
		case syscall.EINTR:
			continue
		case syscall.EAGAIN:
			return false
		default:
			s.errno = e
			return true
		}
		s.n += int(n)
		s.consume(int(n))
	}
}

// consume drops n written bytes from the front of s.bufs.
func (s *Conn) consume(n int) {
	for len(s.bufs) > 0 {
		if n < len(s.bufs[0]) {
			s.bufs[0] = s.bufs[0][n:]
			return
		}
		n -= len(s.bufs[0])
		s.bufs[0] = nil
		s.bufs = s.bufs[1:]
	}
}
