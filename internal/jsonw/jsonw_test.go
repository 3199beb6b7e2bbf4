package jsonw

import (
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestString(t *testing.T) {
	for _, s := range []string{
		"", "plain", `q"b\s/`, "\x00\x01\x1f\x7f", "\b\f\n\r\t", "é中文😀", "\u2028\u2029",
		"\xff", "a\xc3", "\xed\xa0\x80", "<script>&",
	} {
		checkString(t, s)
	}
}

// FuzzString: any Go string is written as valid JSON that reads back as
// the string, or, for invalid UTF-8, as the string with U+FFFD in place
// of each invalid byte.
func FuzzString(f *testing.F) {
	for _, s := range []string{"", "a\"b", "\xff\xfe", "\u2028x\u2029", "\x00é"} {
		f.Add(s)
	}
	f.Fuzz(checkString)
}

func checkString(t *testing.T, s string) {
	enc := String(nil, s)
	if !json.Valid(enc) || !utf8.Valid(enc) {
		t.Fatalf("%q encodes to invalid JSON %s", s, enc)
	}
	var back string
	if err := json.Unmarshal(enc, &back); err != nil {
		t.Fatal(err)
	}
	if want := strings.ToValidUTF8(s, "\uFFFD"); back != want && !strings.ContainsRune(back, utf8.RuneError) {
		t.Errorf("%q round-trips to %q", s, back)
	}
	if utf8.ValidString(s) && back != s {
		t.Errorf("valid %q round-trips to %q", s, back)
	}
}
