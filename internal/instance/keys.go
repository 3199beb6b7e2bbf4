package instance

import "strings"

// Key prefixes of the xllm-service layout, before the namespace.
const (
	prefixLoad    = "XLLM:LOADMETRICS:"
	prefixService = "XLLM:SERVICE:"
	masterName    = "MASTER"
)

var typePrefixes = [...]string{
	Default: "XLLM:DEFAULT:",
	Prefill: "XLLM:PREFILL:",
	Decode:  "XLLM:DECODE:",
	Mix:     "XLLM:MIX:",
}

// NormalizeNamespace turns a namespace option into the key prefix
// xllm-service uses: "" and "/" give "", "foo" and "/foo/" give "/foo/".
func NormalizeNamespace(ns string) string {
	t := strings.Trim(ns, "/")
	if t == "" {
		return ""
	}
	return "/" + t + "/"
}

// keyspace holds the registry's keys under one namespace.
type keyspace struct {
	ns       string
	types    [len(typePrefixes)]string
	load     string
	service  string
	master   string
	self     string // XLLM:SERVICE:<SelfAddr>, "" without one
	rangeBeg string // the watched range [rangeBeg, rangeEnd)
	rangeEnd string
}

func newKeyspace(ns, self string) keyspace {
	k := keyspace{ns: NormalizeNamespace(ns)}
	for t, p := range typePrefixes {
		k.types[t] = k.ns + p
	}
	k.load = k.ns + prefixLoad
	k.service = k.ns + prefixService
	k.master = k.service + masterName
	if self != "" {
		k.self = k.service + self
	}
	// In byte order the prefixes run XLLM:CACHE: < XLLM:DECODE: <
	// XLLM:DEFAULT: < XLLM:LOADMETRICS: < XLLM:MIX: < XLLM:PREFILL: <
	// XLLM:SERVICE:, so one range from XLLM:DECODE: up to the first key
	// past every XLLM:PREFILL: key (';' follows ':') holds every key the
	// registry reads and no XLLM:CACHE: key (R-DIR-3).
	k.rangeBeg = k.types[Decode]
	k.rangeEnd = k.ns + "XLLM:PREFILL;"
	return k
}

type keyKind int

const (
	keyOther keyKind = iota
	keyInstance
	keyLoad
)

// classify names the kind of a key in the watched range, its type for
// an instance key, and the name after the prefix.
func (k *keyspace) classify(key string) (keyKind, Type, string) {
	if name, ok := strings.CutPrefix(key, k.load); ok && name != "" {
		return keyLoad, 0, name
	}
	for t, p := range k.types {
		if name, ok := strings.CutPrefix(key, p); ok && name != "" {
			return keyInstance, Type(t), name
		}
	}
	return keyOther, 0, ""
}

func (k *keyspace) instanceKey(t Type, name string) string { return k.types[t] + name }
func (k *keyspace) loadKey(name string) string             { return k.load + name }
