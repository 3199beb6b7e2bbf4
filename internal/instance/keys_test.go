package instance

import "testing"

func TestNormalizeNamespace(t *testing.T) {
	for in, want := range map[string]string{
		"": "", "/": "", "///": "", "foo": "/foo/", "/foo/": "/foo/", "foo/": "/foo/", "/a/b/": "/a/b/",
	} {
		if got := NormalizeNamespace(in); got != want {
			t.Errorf("NormalizeNamespace(%q) = %q, want %q", in, got, want)
		}
	}
}

// R-DIR-3: the watched range holds every instance and load key and no
// XLLM:CACHE: or XLLM:SERVICE: key, with or without a namespace.
func TestWatchedRange(t *testing.T) {
	for _, ns := range []string{"", "team"} {
		k := newKeyspace(ns, "10.0.0.1:9000")
		in := func(key string) bool { return key >= k.rangeBeg && key < k.rangeEnd }
		p := NormalizeNamespace(ns)
		for _, key := range []string{
			p + "XLLM:DEFAULT:a:1", p + "XLLM:PREFILL:a:1", p + "XLLM:DECODE:a:1", p + "XLLM:MIX:a:1",
			p + "XLLM:LOADMETRICS:a:1", p + "XLLM:PREFILL:\xff",
		} {
			if !in(key) {
				t.Errorf("ns %q: %q outside the watched range", ns, key)
			}
		}
		for _, key := range []string{
			p + "XLLM:CACHE:abc", p + "XLLM:CACHE:\xff", p + "XLLM:SERVICE:MASTER", p + "XLLM:SERVICE:10.0.0.1:9000",
			p + "XLLM_PING", "/other/XLLM:DEFAULT:a:1", "XLLM:DEFAULT:a:1" + p,
		} {
			if in(key) && key != "XLLM:DEFAULT:a:1" {
				t.Errorf("ns %q: %q inside the watched range", ns, key)
			}
		}
		if kind, typ, name := k.classify(p + "XLLM:MIX:1.2.3.4:80"); kind != keyInstance || typ != Mix || name != "1.2.3.4:80" {
			t.Errorf("classify MIX key: %v %v %q", kind, typ, name)
		}
		if kind, _, name := k.classify(p + "XLLM:LOADMETRICS:1.2.3.4:80"); kind != keyLoad || name != "1.2.3.4:80" {
			t.Errorf("classify load key: %v %q", kind, name)
		}
		if kind, _, _ := k.classify(p + "XLLM:DEFAULT:"); kind != keyOther {
			t.Error("a key without a name classified as an instance")
		}
		if k.master != p+"XLLM:SERVICE:MASTER" || k.self != p+"XLLM:SERVICE:10.0.0.1:9000" {
			t.Errorf("service keys %q %q", k.master, k.self)
		}
	}
}
