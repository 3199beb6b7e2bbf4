package devcluster

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/kvcar/kvcar/internal/server"
)

// Match is one stream's answer of kvcar's query API: what one DP rank of
// one instance holds of the queried prompt.
type Match struct {
	InstanceName      string `json:"instance_name"`
	DPRank            int    `json:"dp_rank"`
	Synchronized      bool   `json:"synchronized"`
	DeviceHitTokens   int    `json:"device_hit_tokens"`
	HostOnlyHitTokens int    `json:"host_only_hit_tokens"`
}

// InstanceLoad is one instance as kvcar's registry sees it
// (GET /v1/internal/instances): the load the policies route by.
type InstanceLoad struct {
	Name              string  `json:"name"`
	State             string  `json:"state"`
	DPSize            int     `json:"dp_size"`
	LoadValid         bool    `json:"load_valid"`
	Waiting           uint64  `json:"waiting"`
	GPUCacheUsagePerc float64 `json:"gpu_cache_usage_perc"`
}

// maxAPIAnswer bounds what Query and Instances read of an answer.
const maxAPIAnswer = 16 << 20

// QueryBody is the query API's request body for tokens.
func QueryBody(tokens []uint32) []byte {
	b := make([]byte, 0, 16+7*len(tokens))
	b = append(b, `{"token_ids":[`...)
	for i, t := range tokens {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendUint(b, uint64(t), 10)
	}
	return append(b, "]}"...)
}

// Query sends body (QueryBody) to kvcar's query API on its internal
// listener through hc and returns every stream's match, as the CAR
// policy inside kvcar would see them.
func (k *KVCar) Query(ctx context.Context, hc *http.Client, body []byte) ([]Match, error) {
	var out struct {
		Matches []Match `json:"matches"`
	}
	if err := k.call(ctx, hc, http.MethodPost, server.QueryPath, body, &out); err != nil {
		return nil, err
	}
	return out.Matches, nil
}

// Instances returns kvcar's registry view of every instance.
func (k *KVCar) Instances(ctx context.Context, hc *http.Client) ([]InstanceLoad, error) {
	var out struct {
		Instances []InstanceLoad `json:"instances"`
	}
	if err := k.call(ctx, hc, http.MethodGet, server.InstancesPath, nil, &out); err != nil {
		return nil, err
	}
	return out.Instances, nil
}

func (k *KVCar) call(ctx context.Context, hc *http.Client, method, path string, body []byte, out any) error {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, k.internalURL+path, rd)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := hc.Do(req)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxAPIAnswer))
	if err != nil {
		return fmt.Errorf("%s: reading the answer: %w", path, err)
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s: %s", path, resp.Status, bytes.TrimSpace(b))
	}
	if err := json.Unmarshal(b, out); err != nil {
		return fmt.Errorf("%s: answer: %w", path, err)
	}
	return nil
}

// HasFlag reports whether the kvcar binary knows the flag name, from
// what its --help prints, so that a program can pass a flag only the
// newer binaries have.
func HasFlag(ctx context.Context, binary, name string) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	// --help exits with status 0 or 2 depending on the flag package's
	// mode; only the text matters.
	out, err := exec.CommandContext(ctx, binary, "--help").CombinedOutput()
	if len(out) == 0 && err != nil {
		return false, fmt.Errorf("%s --help: %w", binary, err)
	}
	return strings.Contains(string(out), "-"+name+" ") || strings.Contains(string(out), "-"+name+"\n"), nil
}

// WaitLoads waits until kvcar's registry holds a valid load report for n
// instances: CAR and SLO_AWARE schedule only instances with one.
func (k *KVCar) WaitLoads(ctx context.Context, hc *http.Client, n int, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		ins, err := k.Instances(ctx, hc)
		valid := 0
		for _, in := range ins {
			if in.LoadValid {
				valid++
			}
		}
		if err == nil && valid >= n {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d of %d instances with a load report after %v (last error: %v)", valid, n, timeout, err)
		}
		if err := sleep(ctx, pollInterval); err != nil {
			return err
		}
	}
}
