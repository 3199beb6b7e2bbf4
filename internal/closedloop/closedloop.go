package closedloop

import (
	"bytes"
	"io"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"
)

// Run posts body to url b.N times from conc clients, each sending its
// next request when the last is answered, and reports the p50 and p99
// latency (p50-µs, p99-µs). An error or a status other than 200 fails
// the benchmark.
func Run(b *testing.B, client *http.Client, url string, body []byte, conc int) {
	lat := make([]time.Duration, b.N)
	next := make(chan int, b.N)
	for i := range b.N {
		next <- i
	}
	close(next)
	var wg sync.WaitGroup
	b.ReportAllocs()
	b.ResetTimer()
	for range conc {
		wg.Go(func() {
			for i := range next {
				t0 := time.Now()
				resp, err := client.Post(url, "application/json", bytes.NewReader(body))
				if err != nil {
					b.Error(err)
					return
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					b.Errorf("status %d", resp.StatusCode)
					return
				}
				lat[i] = time.Since(t0)
			}
		})
	}
	wg.Wait()
	b.StopTimer()
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
}
