package main

import (
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"
)

// write prints the table; with readme, first when, where and how it was
// made.
func (r *report) write(w io.Writer, readme bool) {
	if readme {
		fmt.Fprintf(w, "Generated %s from %s in %.0f s by\n\n```sh\n%s\n```\n\n",
			r.started.Format("2006-01-02 15:04 UTC"), r.revision, r.elapsed.Seconds(), r.command)
		engines := fmt.Sprintf("%d trivial engines registered as vLLM servers, relayed to over HTTP (an answer at once, keep-alive idle timeout %v)",
			r.opts.engines, r.opts.engineIdle)
		if r.opts.backend == backendXLLM {
			engines = fmt.Sprintf("%d emulated xLLM engines (enginesim at a time scale of 1e-6), dispatched to over baidu_std; "+
				"direct cells are their HTTP path", r.opts.engines)
		}
		output := fmt.Sprintf("max_tokens %d", r.opts.maxTokens)
		if r.opts.stream {
			output += ", streamed (an SSE event per token)"
		}
		fmt.Fprintf(w, "%s, %d distinct prompts of random ids below %d per size sent in turn, %s, closed loop, "+
			"%v warm-up then a %v window per cell. Idle CPUs: %s.\n\n", engines, r.opts.prompts, vocab, output, r.opts.warmup, r.opts.duration, r.idle)
	}
	fmt.Fprintln(w, "| policy | prompt ids | clients | req/s | direct req/s | vs direct | p50 | direct p50 | added p50 | p99 | direct p99 | CPU / request (kvcar or relay) | errors | 502 | load avg (start → end) |")
	fmt.Fprintln(w, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---|")
	for _, c := range r.cells {
		d := c.direct
		ratio := ""
		if d.rate() > 0 {
			ratio = fmt.Sprintf("%.0f %%", 100*c.rate()/d.rate())
		}
		errs := errorsText(c)
		if d.errors() > 0 {
			errs += " (direct: " + errorsText(d) + ")"
		}
		fmt.Fprintf(w, "| %s | %d | %d | %.0f | %.0f | %s | %s | %s | %s | %s | %s | %s | %s | %d | %.2f → %.2f |\n",
			c.target, c.ids, c.conc, c.rate(), d.rate(), ratio, us(c.p50), us(d.p50), us(c.p50-d.p50), us(c.p99), us(d.p99),
			us(c.cpuPerRequest()), errs, c.byStatus[502], d.loadAtStart, c.load1)
	}
}

// us formats d in microseconds.
func us(d time.Duration) string {
	return strconv.FormatFloat(float64(d)/float64(time.Microsecond), 'f', 0, 64) + " µs"
}

// errorsText lists the errors by status, "cut" for answers that ended
// early, "conn" for no answer at all.
func errorsText(c *cell) string {
	if c.errors() == 0 {
		return "0"
	}
	var parts []string
	codes := make([]int, 0, len(c.byStatus))
	for s := range c.byStatus {
		codes = append(codes, s)
	}
	slices.Sort(codes)
	for _, s := range codes {
		parts = append(parts, fmt.Sprintf("%d×%d", c.byStatus[s], s))
	}
	if c.cut > 0 {
		parts = append(parts, fmt.Sprintf("%d×cut", c.cut))
	}
	if c.connErr > 0 {
		parts = append(parts, fmt.Sprintf("%d×conn", c.connErr))
	}
	return strings.Join(parts, ", ")
}
