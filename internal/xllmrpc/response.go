package xllmrpc

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"

	"github.com/kvcar/kvcar/internal/xllmpb"
)

// responder writes one request's OpenAI response from its generations,
// as xllm-service's response handler writes it: streamed, a chunk per
// output text and one per finish reason (chat: a first chunk with the
// assistant role), a usage chunk with stream_options.include_usage, then
// "data: [DONE]"; unstreamed, one body once the request has finished,
// from the generations not marked finished_on_prefill_instance.
type responder struct {
	w       http.ResponseWriter
	rc      *http.ResponseController
	pr      *parsedRequest
	created int64
	id      string
	started bool // the stream's status and headers are out

	// roleSent, texts and finish are made when first needed: most
	// requests have one choice, and only a streamed chat sends roles.
	roleSent map[int32]bool
	// The unstreamed output so far, by choice index.
	texts  map[int32]*strings.Builder
	finish map[int32]string
	usage  *xllmpb.OutputUsage
	// buf holds the event or body being written; it is reused for the
	// next.
	buf []byte
}

func newResponder(w http.ResponseWriter, pr *parsedRequest, created int64) *responder {
	return &responder{w: w, rc: http.NewResponseController(w), pr: pr, created: created}
}

func (r *responder) object() string {
	switch {
	case r.pr.chat && r.pr.stream:
		return "chat.completion.chunk"
	case r.pr.chat:
		return "chat.completion"
	}
	return "text_completion"
}

// add takes one generation; done is true once the response is complete.
func (r *responder) add(g *xllmpb.DisaggStreamGeneration) (done bool, err error) {
	if r.id == "" {
		r.id = g.GetReqId()
	}
	if r.pr.stream {
		return r.stream(g)
	}
	if g.GetFinishedOnPrefillInstance() && !g.GetFinished() {
		// The decode instance sends the whole result.
		return false, nil
	}
	for _, o := range g.GetOutputs() {
		if r.texts == nil {
			r.texts, r.finish = map[int32]*strings.Builder{}, map[int32]string{}
		}
		b := r.texts[o.GetIndex()]
		if b == nil {
			b = &strings.Builder{}
			r.texts[o.GetIndex()] = b
		}
		b.WriteString(o.GetText())
		if o.GetFinishReason() != "" {
			r.finish[o.GetIndex()] = o.GetFinishReason()
		}
	}
	if g.GetUsage() != nil {
		r.usage = g.GetUsage()
	}
	if !g.GetFinished() {
		return false, nil
	}
	resp := responseJSON{ID: r.id, Object: r.object(), Created: r.created, Model: r.pr.model, Usage: usageOf(r.usage),
		Choices: []choiceJSON{}}
	indices := make([]int32, 0, len(r.texts))
	for i := range r.texts {
		indices = append(indices, i)
	}
	slices.Sort(indices)
	for _, i := range indices {
		text := r.texts[i].String()
		c := choiceJSON{Index: i}
		if f, ok := r.finish[i]; ok {
			c.FinishReason = &f
		}
		if r.pr.chat {
			c.Message = &messageJSON{Role: "assistant", Content: &text}
		} else {
			c.Text = &text
		}
		resp.Choices = append(resp.Choices, c)
	}
	r.buf = append(appendResponse(r.buf[:0], &resp), '\n')
	h := r.w.Header()
	h.Set("Content-Type", "application/json")
	r.w.WriteHeader(http.StatusOK)
	if _, err := r.w.Write(r.buf); err != nil {
		return true, fmt.Errorf("writing the response: %w", err)
	}
	return true, nil
}

// stream writes the chunks of one generation. The stream's end is
// flushed at once; other chunks are flushed by the caller (flushStream)
// once it has written every generation it took.
func (r *responder) stream(g *xllmpb.DisaggStreamGeneration) (bool, error) {
	for _, o := range g.GetOutputs() {
		i := o.GetIndex()
		if r.pr.chat && !r.roleSent[i] {
			empty := ""
			if err := r.chunk(choiceJSON{Index: i, Delta: &messageJSON{Role: "assistant", Content: &empty}}, nil); err != nil {
				return true, err
			}
			if r.roleSent == nil {
				r.roleSent = map[int32]bool{}
			}
			r.roleSent[i] = true
		}
		if text := o.GetText(); text != "" {
			c := choiceJSON{Index: i}
			if r.pr.chat {
				c.Delta = &messageJSON{Content: &text}
			} else {
				c.Text = &text
			}
			if err := r.chunk(c, nil); err != nil {
				return true, err
			}
		}
		if f := o.GetFinishReason(); f != "" {
			c := choiceJSON{Index: i, FinishReason: &f}
			if r.pr.chat {
				c.Delta = &messageJSON{}
			} else {
				empty := ""
				c.Text = &empty
			}
			if err := r.chunk(c, nil); err != nil {
				return true, err
			}
		}
	}
	if r.pr.includeUsage && g.GetUsage() != nil {
		if err := r.chunk(choiceJSON{}, usageOf(g.GetUsage())); err != nil {
			return true, err
		}
	}
	if !g.GetFinished() {
		// collect flushes once it has written every generation queued.
		return false, nil
	}
	r.buf = append(r.buf[:0], "data: [DONE]\n\n"...)
	if err := r.write(r.buf); err != nil {
		return true, err
	}
	return true, r.flush()
}

// chunk writes one SSE event: a choice, or the usage with no choices.
func (r *responder) chunk(c choiceJSON, usage *usageJSON) error {
	one := [1]choiceJSON{c}
	resp := responseJSON{ID: r.id, Object: r.object(), Created: r.created, Model: r.pr.model, Usage: usage, Choices: one[:0]}
	if usage == nil {
		resp.Choices = one[:]
	}
	r.buf = append(r.buf[:0], "data: "...)
	r.buf = append(appendResponse(r.buf, &resp), "\n\n"...)
	return r.write(r.buf)
}

// write sends b, the stream's status and headers first.
func (r *responder) write(b []byte) error {
	if !r.started {
		h := r.w.Header()
		h.Set("Content-Type", "text/event-stream")
		h.Set("Cache-Control", "no-cache")
		r.w.WriteHeader(http.StatusOK)
		r.started = true
	}
	if _, err := r.w.Write(b); err != nil {
		return fmt.Errorf("writing to the client: %w", err)
	}
	return nil
}

// flushStream sends what a stream has written: after the generations of
// one wake-up, so that those that queued up go out in one write.
func (r *responder) flushStream() error {
	if !r.pr.stream || !r.started {
		return nil
	}
	return r.flush()
}

func (r *responder) flush() error {
	if err := r.rc.Flush(); err != nil && !errors.Is(err, http.ErrNotSupported) {
		return fmt.Errorf("flushing to the client: %w", err)
	}
	return nil
}

// fail ends the response with an error: an HTTP error while nothing has
// been sent, else an SSE error event. It returns the error for the
// caller's log.
func (r *responder) fail(code int, msg string) error {
	err := fmt.Errorf("%s (HTTP %d)", msg, code)
	if !r.started {
		writeHTTPError(r.w, code, msg)
		return err
	}
	b, _ := json.Marshal(errorJSON(code, msg))
	r.buf = append(append(append(r.buf[:0], "data: "...), b...), "\n\n"...)
	if werr := r.write(r.buf); werr == nil {
		_ = r.flush()
	}
	return err
}
