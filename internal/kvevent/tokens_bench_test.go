package kvevent_test

import (
	"fmt"
	"testing"

	"github.com/kvcar/kvcar/internal/kvevent"
	"github.com/kvcar/kvcar/internal/kvindex/prefillgen"
)

// BenchmarkDecodeTokens measures decoding a prefill's BlockStored of 64
// blocks of 128 tokens, whose time is almost all reading token ids, by
// the text the ids come from (see prefillgen.Text), and with variants=1
// the same ids in every message against variants=64 ids of their own
// (fresh, as live traffic is). ns/token is the time per token id.
func BenchmarkDecodeTokens(b *testing.B) {
	for _, text := range []prefillgen.Text{prefillgen.Real, prefillgen.Uniform} {
		for _, variants := range []int{1, 64} {
			b.Run(fmt.Sprintf("text=%v/variants=%d", text, variants), func(b *testing.B) {
				msg := prefillgen.NewWith(b, prefillgen.Options{BlocksPerEvent: 64, Text: text, Variants: variants})
				dec := kvevent.NewDecoder(8 << 20)
				var batch kvevent.Batch
				b.SetBytes(int64(len(msg.Payload)))
				b.ReportAllocs()
				i := 0
				for b.Loop() {
					msg.Rewrite(i, 0)
					if err := dec.DecodeBatch(msg.Payload, &batch); err != nil {
						b.Fatal(err)
					}
					i++
				}
				tokens := float64(b.N) * prefillgen.Blocks * prefillgen.BlockSize
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/tokens, "ns/token")
				b.ReportMetric(float64(b.N)*prefillgen.Blocks/b.Elapsed().Seconds(), "blocks/s")
			})
		}
	}
}
