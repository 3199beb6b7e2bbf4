package tokenizer

import (
	"context"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"
)

// TestEncodeContextStops covers issue 10 item 1: encoding stops soon
// after the caller's context ends, returning its error and dst as it
// was, for a text that is one long word (spaces, the costliest input per
// byte) and for one of many words. Uninterrupted, each costs seconds.
func TestEncodeContextStops(t *testing.T) {
	tk := load(t, "qwen2like")
	for _, tc := range []struct{ name, text string }{
		{"one word of 4 MiB of spaces", strings.Repeat(" ", 4<<20)},
		{"many distinct words", manyWords(1 << 20)},
	} {
		ctx, cancel := context.WithTimeout(t.Context(), 20*time.Millisecond)
		began := time.Now()
		got, err := tk.EncodeContext(ctx, tc.text, []uint32{7})
		took := time.Since(began)
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("%s: err %v, want the context's deadline", tc.name, err)
		}
		if !reflect.DeepEqual(got, []uint32{7}) {
			t.Errorf("%s: dst became %d ids, want it as it was", tc.name, len(got))
		}
		// The error shows it stopped before the end. The time is 20 ms,
		// one check interval and the steps before merging (splitting,
		// allocating the merge tables), which are linear and not
		// interrupted: a few hundred ms, more under -race on loaded cores.
		// Uninterrupted, the word of spaces costs 7 s without -race.
		if took > 5*time.Second {
			t.Errorf("%s: took %v after a 20 ms deadline", tc.name, took)
		}
		t.Logf("%s: stopped after %v", tc.name, took.Round(time.Millisecond))
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := tk.EncodeChatContext(ctx, []Message{{Role: "user", Content: "hi"}}, nil); !errors.Is(err, context.Canceled) {
		t.Errorf("chat with an ended context: err %v", err)
	}
}

// TestEncodeContextSameIDs: a context that does not end changes nothing.
func TestEncodeContextSameIDs(t *testing.T) {
	tk := load(t, "qwen2like")
	text := manyWords(2000) + strings.Repeat(" ", 300) + "end"
	want, err := tk.Encode(text, nil)
	if err != nil {
		t.Fatal(err)
	}
	got, err := tk.EncodeContext(t.Context(), text, nil)
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("EncodeContext: %d ids, %v; Encode: %d ids", len(got), err, len(want))
	}
	msgs := []Message{{Role: "user", Content: text}}
	want, err = tk.EncodeChat(msgs, nil)
	if err != nil {
		t.Fatal(err)
	}
	got, err = tk.EncodeChatContext(t.Context(), msgs, nil)
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("EncodeChatContext: %d ids, %v; EncodeChat: %d ids", len(got), err, len(want))
	}
}

// manyWords returns about n bytes of words that the word cache does not
// already hold.
func manyWords(n int) string {
	var b strings.Builder
	for i := 0; b.Len() < n; i++ {
		b.WriteString(" w")
		for v := i; v > 0; v /= 26 {
			b.WriteByte(byte('a' + v%26))
		}
	}
	return b.String()
}
