// Package zapslog adapts zap, the only logger etcd's client and server
// accept, to log/slog, so that everything kvcar logs goes through one
// slog handler with one format and level.
//
// It must not know about etcd or any kvcar package.
package zapslog
