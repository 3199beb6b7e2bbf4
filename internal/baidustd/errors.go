package baidustd

import (
	"errors"
	"fmt"
	"strconv"
)

// Errno is brpc's error code (src/brpc/errno.proto), carried in
// RpcResponseMeta.error_code.
type Errno int32

// brpc's error codes that this package sends or a client may receive.
const (
	ENOSERVICE    Errno = 1001 // service not found
	ENOMETHOD     Errno = 1002 // method not found
	EREQUEST      Errno = 1003 // bad request
	ERPCAUTH      Errno = 1004 // unauthorized
	ERPCTIMEDOUT  Errno = 1008 // call timed out
	EFAILEDSOCKET Errno = 1009 // broken connection
	EOVERCROWDED  Errno = 1011 // too many pending writes
	EINTERNAL     Errno = 2001 // internal server error (a handler's plain error)
	ERESPONSE     Errno = 2002 // bad response
	ELOGOFF       Errno = 2003 // server is stopping
	ELIMIT        Errno = 2004 // server's limit on resources reached
)

var errnoNames = map[Errno]string{
	ENOSERVICE: "ENOSERVICE", ENOMETHOD: "ENOMETHOD", EREQUEST: "EREQUEST", ERPCAUTH: "ERPCAUTH",
	ERPCTIMEDOUT: "ERPCTIMEDOUT", EFAILEDSOCKET: "EFAILEDSOCKET", EOVERCROWDED: "EOVERCROWDED",
	EINTERNAL: "EINTERNAL", ERESPONSE: "ERESPONSE", ELOGOFF: "ELOGOFF", ELIMIT: "ELIMIT",
}

func (e Errno) String() string {
	if n, ok := errnoNames[e]; ok {
		return n
	}
	return "E" + strconv.Itoa(int(e))
}

// Error is a failed call: the error_code and error_text of a response.
// A handler returns one to choose the code; the client returns one for
// every response with a non-zero error_code, and for calls that end
// without a response (ERPCTIMEDOUT, EFAILEDSOCKET).
type Error struct {
	Code Errno
	Text string
	// cause is what ended a call without a response, for errors.Is.
	cause error
}

func (e *Error) Error() string {
	return fmt.Sprintf("baidu_std: error_code %d (%v): %s", int32(e.Code), e.Code, e.Text)
}

func (e *Error) Unwrap() error { return e.cause }

// Errorf makes an *Error with code and a formatted text.
func Errorf(code Errno, format string, args ...any) *Error {
	return &Error{Code: code, Text: fmt.Sprintf(format, args...)}
}

// CodeOf returns the Errno of err: its own when it is or wraps an *Error,
// 0 when err is nil, EINTERNAL otherwise.
func CodeOf(err error) Errno {
	if err == nil {
		return 0
	}
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	return EINTERNAL
}

// FrameError is a frame that breaks the framing; the connection it came
// on cannot be read further and is closed.
type FrameError struct {
	Reason string
}

func (e *FrameError) Error() string { return "baidu_std: bad frame: " + e.Reason }

func frameErrorf(format string, args ...any) error {
	return &FrameError{Reason: fmt.Sprintf(format, args...)}
}
