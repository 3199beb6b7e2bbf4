package server

import (
	"errors"
	"io"
	"net/http"
	"strconv"

	"github.com/kvcar/kvcar/internal/instance"
)

// HeartbeatPath is the route engines report their loads to.
const HeartbeatPath = "/v1/internal/heartbeat"

// maxHeartbeatBytes bounds a heartbeat body: a few hundred bytes of
// loads, plus the deprecated cache_event an old engine may still send.
const maxHeartbeatBytes = 1 << 20

// HeartbeatSink takes engine heartbeats: the instance registry.
type HeartbeatSink interface {
	Heartbeat(hb instance.Heartbeat) error
}

// handleHeartbeat serves POST /v1/internal/heartbeat: the proto-JSON
// HeartbeatRequest of an engine (R-CAR-10). Unknown instances and stale
// incarnations get 409 so the engine re-registers, with one generic
// body for both (the detail is logged); a value out of range
// (instance.Heartbeat.Validate) gets 400 naming the field and changes
// nothing; the deprecated cache_event field is ignored (R-CAR-11).
func (s *Server) handleHeartbeat(w http.ResponseWriter, r *http.Request) {
	if ok, why := s.authorized(r); !ok {
		s.reject(w, r, http.StatusUnauthorized, why)
		return
	}
	if s.heartbeats == nil {
		s.reject(w, r, http.StatusServiceUnavailable, "no instance registry: kvcar runs without etcd discovery")
		return
	}
	if r.ContentLength > maxHeartbeatBytes {
		s.reject(w, r, http.StatusRequestEntityTooLarge, "request body exceeds "+strconv.Itoa(maxHeartbeatBytes)+" bytes")
		return
	}
	// The query path's pooled read buffer holds a heartbeat many times
	// over; the parsed heartbeat keeps nothing of it.
	buf := s.buffers.Get().(*queryBuffers)
	defer s.buffers.Put(buf)
	body, err := appendBody(buf.read[:0], http.MaxBytesReader(w, r.Body, maxHeartbeatBytes))
	if err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			s.reject(w, r, http.StatusRequestEntityTooLarge, "request body exceeds "+strconv.Itoa(maxHeartbeatBytes)+" bytes")
			return
		}
		s.reject(w, r, http.StatusBadRequest, "reading body: "+err.Error())
		return
	}
	hb, err := instance.ParseHeartbeat(body)
	if err != nil {
		s.reject(w, r, http.StatusBadRequest, err.Error())
		return
	}
	if err := s.heartbeats.Heartbeat(hb); err != nil {
		switch {
		case errors.Is(err, instance.ErrInvalidHeartbeat):
			s.reject(w, r, http.StatusBadRequest, err.Error())
		case errors.Is(err, instance.ErrUnknownInstance) || errors.Is(err, instance.ErrStaleIncarnation):
			// The body tells the sender only to register again: neither
			// which of the two it was nor the registered incarnation,
			// which would let anyone who can reach this route learn
			// identities and forge heartbeats for them. Logged at Debug,
			// like the rpc intake: an engine re-registers after one
			// refusal, and anyone who can reach the route could otherwise
			// fill the log; kvcar_http_requests_total{code="409"} counts them.
			s.log.Debug("heartbeat refused", "remote", r.RemoteAddr, "instance", hb.Name, "err", err)
			writeError(w, http.StatusConflict, heartbeatConflict)
		default:
			s.reject(w, r, http.StatusInternalServerError, err.Error())
		}
		return
	}
	writeJSON(w, http.StatusOK, []byte("{}\n"))
}

// heartbeatConflict is the one body of every 409 the intake sends.
const heartbeatConflict = "heartbeat does not match a registered instance; register again"

// appendBody appends all of r to dst, growing it only when it is full.
func appendBody(dst []byte, r io.Reader) ([]byte, error) {
	for {
		if len(dst) == cap(dst) {
			dst = append(dst, 0)[:len(dst)]
		}
		n, err := r.Read(dst[len(dst):cap(dst)])
		dst = dst[:len(dst)+n]
		if err == io.EOF {
			return dst, nil
		}
		if err != nil {
			return dst, err
		}
	}
}
