package server

// SetNotReady closes the routes that are served only once the service is
// ready (R-API-1), as SetReady(false) does, and says why: /ready, their
// 503 answers and the status page carry the reason, so that an operator
// sees what the service waits for.
func (s *Server) SetNotReady(reason string) {
	s.notReadyWhy.Store(&reason)
	s.ready.Store(false)
}

// notReadyMessage is the message of a 503 answered before readiness.
func (s *Server) notReadyMessage() string {
	if why := s.notReadyReason(); why != "" {
		return "service is not ready: " + why
	}
	return "service is not ready"
}

// notReadyReason is the reason given to SetNotReady, "" without one.
func (s *Server) notReadyReason() string {
	if why := s.notReadyWhy.Load(); why != nil {
		return *why
	}
	return ""
}
