package instance

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
)

// MaxDPSize bounds an instance's dp_size. The directory addresses DP
// ranks 0..1023 (the KV events config's dp_rank range), so a larger
// instance could never be indexed whole; and every DP rank costs work
// on each discovery pass and CAR decision, so an unbounded value lets
// one registration take a core (dp_size 35534 cost a third of one).
const MaxDPSize = 1024

// maxHostLen is the longest DNS name (RFC 1035), without a trailing dot.
const maxHostLen = 253

// ErrBadName: an instance name is not a business address host:port.
var ErrBadName = errors.New("instance name is not host:port")

// CheckName reports whether name is an instance's business HTTP address
// as kvcar may use it in a URL (http://<name>/...) and in derived
// endpoints: host:port, where host is a DNS name, an IPv4 address or an
// IPv6 address in brackets, and port a decimal number in [1, 65535]
// without leading zeros.
// Anything else a URL could carry — a path, a query, user info, a
// fragment, percent escapes, an IPv6 zone, whitespace — is refused, so
// that a registration cannot point a request somewhere its name does
// not say.
func CheckName(name string) error {
	if err := checkName(name); err != nil {
		return fmt.Errorf("%w: %q %s", ErrBadName, clipName(name), err)
	}
	return nil
}

func checkName(name string) error {
	i := strings.LastIndexByte(name, ':')
	if i < 0 {
		return nameError("has no port")
	}
	host, port := name[:i], name[i+1:]
	if err := checkPort(port); err != nil {
		return err
	}
	if strings.HasPrefix(host, "[") {
		ip, ok := strings.CutSuffix(host[1:], "]")
		if !ok || !strings.Contains(ip, ":") || net.ParseIP(ip) == nil {
			return nameError("has a bracketed host that is not an IPv6 address")
		}
		return nil
	}
	if host == "" {
		return nameError("has no host")
	}
	if strings.Contains(host, ":") {
		return nameError("has an IPv6 host without brackets")
	}
	if net.ParseIP(host) != nil {
		return nil
	}
	return checkDNSName(host)
}

// nameError is a reason CheckName gives; a string type keeps the checks
// free of allocations until one fails.
type nameError string

func (e nameError) Error() string { return string(e) }

func checkPort(port string) error {
	if port == "" {
		return nameError("has no port")
	}
	for i := 0; i < len(port); i++ {
		if port[i] < '0' || port[i] > '9' {
			return nameError("has a port that is not a decimal number")
		}
	}
	// One address, one name: "h:080" would be another instance than
	// "h:80" and escape the port conflict checks of discovery.
	if len(port) > 1 && port[0] == '0' {
		return nameError("has a port with a leading zero")
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return nameError("has a port outside [1, 65535]")
	}
	return nil
}

// checkDNSName accepts a host name of letters, digits and hyphens in
// dot-separated labels of 1 to 63 characters that neither start nor end
// with a hyphen (RFC 1123), whose last label is not all digits (that
// would be a malformed IPv4 address).
func checkDNSName(host string) error {
	if len(host) > maxHostLen {
		return nameError("has a host name longer than 253 characters")
	}
	labels := strings.Split(host, ".")
	for _, l := range labels {
		if l == "" || len(l) > 63 {
			return nameError("has a host name with an empty label or one longer than 63 characters")
		}
		if l[0] == '-' || l[len(l)-1] == '-' {
			return nameError("has a host name label that starts or ends with a hyphen")
		}
		for i := 0; i < len(l); i++ {
			c := l[i]
			if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-') {
				return nameError("has a host that is neither an IP address nor a DNS name")
			}
		}
	}
	last := labels[len(labels)-1]
	if strings.Trim(last, "0123456789") == "" {
		return nameError("has a host that is neither an IP address nor a DNS name")
	}
	return nil
}

// clipName keeps log lines and errors short whatever a name holds.
func clipName(name string) string {
	const max = 80
	if len(name) > max {
		return name[:max] + "..."
	}
	return name
}
