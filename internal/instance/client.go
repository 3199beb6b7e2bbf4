package instance

import (
	"errors"
	"log/slog"
	"os"
	"slices"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap/zapcore"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"

	"github.com/kvcar/kvcar/internal/zapslog"
)

// Environment variables of etcd authentication, as xllm-service reads
// them.
const (
	EnvEtcdUsername = "ETCD_USERNAME"
	EnvEtcdPassword = "ETCD_PASSWORD"
)

// ClientConfig is the etcd client configuration of the service:
// endpoints, timeouts, quick reconnection after an etcd outage, and
// authentication from ETCD_USERNAME and ETCD_PASSWORD as read through env
// (nil reads the process environment). Setting only one of the two is an
// error, as in xllm-service. The client's own log goes to log at warning
// level and above; nil discards it.
func ClientConfig(endpoints []string, env func(string) string, log *slog.Logger) (clientv3.Config, error) {
	if env == nil {
		env = os.Getenv
	}
	user, pass := env(EnvEtcdUsername), env(EnvEtcdPassword)
	if (user == "") != (pass == "") {
		return clientv3.Config{}, errors.New("instance: " + EnvEtcdUsername + " and " + EnvEtcdPassword + " must be set together")
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return clientv3.Config{
		Endpoints:            slices.Clone(endpoints),
		DialTimeout:          5 * time.Second,
		DialKeepAliveTime:    10 * time.Second,
		DialKeepAliveTimeout: 3 * time.Second,
		Username:             user,
		Password:             pass,
		Logger:               zapslog.New(log, zapcore.WarnLevel, "etcd client: ", nil),
		// gRPC's default reconnection backoff grows to two minutes; the
		// registry must see an etcd that is back within seconds.
		DialOptions: []grpc.DialOption{grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 2 * time.Second},
			MinConnectTimeout: 2 * time.Second,
		})},
	}, nil
}
