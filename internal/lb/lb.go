package lb

import (
	"errors"
	"fmt"
	"reflect"

	"github.com/kvcar/kvcar/internal/instance"
	"github.com/kvcar/kvcar/internal/kvdir"
)

// Policy names, the values of --load_balance_policy. They are
// case-sensitive, as the xllm-service flag is.
const (
	PolicyRR       = "RR"
	PolicyCAR      = "CAR"
	PolicySLOAware = "SLO_AWARE"
)

// Flag defaults, as xllm_master_serving defines them.
const (
	DefaultCARPrefillLambda = 0.5
	DefaultCARHostHitWeight = 0.5
	DefaultTargetTTFTms     = 1000
	DefaultTargetTPOTms     = 50
)

// ErrNoCandidate is returned, wrapped with the reason, when no instance
// can take the request. errors.Is(err, ErrNoCandidate) tells it apart
// from configuration errors.
var ErrNoCandidate = errors.New("lb: no candidate instance")

// Policy chooses the instances that serve one request. Route reads only
// its arguments and in-process state; implementations are safe for
// concurrent use.
type Policy interface {
	// Name is the --load_balance_policy value of the policy.
	Name() string
	// Route chooses a prefill (or DEFAULT) instance and, when that one
	// needs one, a decode instance from snap.
	Route(req Request, snap *instance.Snapshot) (Decision, error)
}

// Releaser is a Policy that keeps state per routed request: the caller
// calls Release once the request of a Decision with a Ticket has ended.
// *CAR is one.
type Releaser interface {
	Release(d Decision)
}

var _ Releaser = (*CAR)(nil)

// Request is what a policy knows about a request. The policy does not
// retain TokenIDs.
type Request struct {
	// TokenIDs are the chat-templated prompt token ids, when the request
	// path has them; CAR needs them for prefix hits.
	TokenIDs []uint32
	// PromptTokens is the prompt length when TokenIDs are unknown; it is
	// ignored when TokenIDs is not empty.
	PromptTokens int
}

// InputTokens is the prompt length: len(TokenIDs), else PromptTokens.
func (r Request) InputTokens() int {
	if len(r.TokenIDs) > 0 {
		return len(r.TokenIDs)
	}
	return max(r.PromptTokens, 0)
}

// Decision is a routing decision: the names carried as
// routing{prefill_name, decode_name} to the engines.
type Decision struct {
	// Prefill is the instance that runs the prefill: a PREFILL, a MIX
	// playing PREFILL, or a DEFAULT instance.
	Prefill string
	// Decode is the decode instance; "" when a DEFAULT instance serves
	// the whole request alone.
	Decode string
	// Policy is the Name of the policy that decided.
	Policy string
	// HitRatio is the chosen prefill instance's KV hit ratio in [0,1]
	// (CAR only; 0 for the other policies).
	HitRatio float64
	// PrefillScore is the chosen prefill instance's cost: the CAR score,
	// or the SLO_AWARE predicted TTFT in ms; 0 for RR.
	PrefillScore float64
	// DecodeScore is the chosen decode instance's cost: the CAR D score,
	// or the SLO_AWARE predicted TPOT in ms; 0 for RR or without a
	// decode instance.
	DecodeScore float64
	// Ticket identifies the decision to Releaser.Release when the
	// policy keeps state per routed request (CAR with dispatch
	// accounting); 0 when it keeps none.
	Ticket uint64
	// Reason says in a few fixed words why these instances won; it is a
	// constant string, so building a decision allocates nothing.
	Reason string
}

// PrefixView answers prefix-hit queries from the in-process KV
// directory; *kvdir.Directory satisfies it. Hits appends one hit per
// stream of the layout it returns, in the layout's order (sorted by
// instance name in byte order, as instance.Snapshot sorts instances,
// then DP rank), and returns the extended slice; it must not block on
// the network (R-DIR-4). A layout is immutable, and the same value as
// long as the streams are, so CAR keeps what it derives from one.
type PrefixView interface {
	Hits(tokenIDs []uint32, dst []kvdir.Hit) (*kvdir.Layout, []kvdir.Hit)
}

var _ PrefixView = (*kvdir.Directory)(nil)

// Options are the flags the policies read. The zero value is not the
// flag defaults (a zero λ is a valid choice): start from DefaultOptions.
type Options struct {
	// CARPrefillLambda is --car_prefill_lambda, in [0,1].
	CARPrefillLambda float64
	// CARHostHitWeight is --car_host_hit_weight, in [0,1].
	CARHostHitWeight float64
	// Prefix is the KV directory view CAR queries; nil when the index is
	// disabled (empty --kv_events_config_file), which makes every hit
	// ratio 0 (R-CFG-1).
	Prefix PrefixView
	// Accounting is CAR's router-side accounting; its zero value (and
	// DefaultOptions) leaves both parts off.
	Accounting AccountingOptions
	// TargetTTFTms is --target_ttft in ms, non-negative.
	TargetTTFTms int
	// TargetTPOTms is --target_tpot in ms, non-negative.
	TargetTPOTms int
}

// DefaultOptions returns the flag defaults, with no prefix view.
func DefaultOptions() Options {
	return Options{
		CARPrefillLambda: DefaultCARPrefillLambda,
		CARHostHitWeight: DefaultCARHostHitWeight,
		TargetTTFTms:     DefaultTargetTTFTms,
		TargetTPOTms:     DefaultTargetTPOTms,
	}
}

// New returns the policy called name (a --load_balance_policy value).
// Only the options of that policy are validated.
func New(name string, opts Options) (Policy, error) {
	switch name {
	case PolicyRR:
		return NewRR(), nil
	case PolicyCAR:
		c, err := NewCAR(opts.CARPrefillLambda, opts.CARHostHitWeight)
		if err != nil {
			return nil, err
		}
		c.SetPrefixView(opts.Prefix)
		if err := c.EnableAccounting(opts.Accounting); err != nil {
			return nil, err
		}
		return c, nil
	case PolicySLOAware:
		return NewSLOAware(opts.TargetTTFTms, opts.TargetTPOTms)
	}
	return nil, fmt.Errorf("lb: --load_balance_policy %q is not one of %s, %s, %s (case-sensitive)",
		name, PolicyRR, PolicyCAR, PolicySLOAware)
}

// isNilView reports whether v is nil or an interface holding a nil
// pointer, such as a *kvdir.Directory never created because the index
// is disabled: calling Query on it would crash the request path.
func isNilView(v PrefixView) bool {
	if v == nil {
		return true
	}
	rv := reflect.ValueOf(v)
	switch rv.Kind() {
	case reflect.Pointer, reflect.Interface, reflect.Map, reflect.Slice, reflect.Func, reflect.Chan:
		return rv.IsNil()
	}
	return false
}
