package server

import "strconv"

// maxChatMessages bounds the messages kept for the tokenizer: each costs
// a span here and a map in the chat template, so a body of many empty
// messages would otherwise cost far more than its bytes.
const maxChatMessages = 1 << 14

// inference is what the single pass over a completion body finds. Its
// slices are pooled storage, reused from request to request.
type inference struct {
	// ids are the prompt's token ids when it was given as ids (hasIDs);
	// for a batch, those of its first prompt.
	ids    []uint32
	hasIDs bool
	// text holds, when the limits ask to keep it, the decoded prompt
	// text, or the chat messages' roles and contents that msgs index.
	text []byte
	msgs []chatSpan
	// textLen is the length of the prompt's text as written, which
	// load-only routing estimates the prompt's tokens from.
	textLen int
	// routingStart and routingEnd are the body offsets of the value of a
	// top-level "routing" member; routingStart is -1 when there is none.
	routingStart, routingEnd int
	// promptStart and promptEnd are the body offsets of the value of
	// "prompt" (completions) or "messages" (chat).
	promptStart, promptEnd int
	// prompts is the number of prompts of a completion: 1, or the length
	// of a batch, of which the first is kept.
	prompts int
	// stack is skipValue's scratch.
	stack []byte
}

// chatSpan locates one message's role and content in inference.text,
// and the message object in the body.
type chatSpan struct {
	roleStart, roleEnd       int
	contentStart, contentEnd int
	objStart, objEnd         int
	// other is set when the message has members besides role and
	// content (tool_calls, reasoning_content, …), which the body holds.
	other bool
}

// inferenceLimits are what one completion body may make kvcar keep.
type inferenceLimits struct {
	maxIDs int
	// keepText asks for the text of the prompt or messages (a tokenizer
	// will read it), at most maxText bytes of it.
	keepText bool
	maxText  int
}

func (in *inference) reset() {
	in.ids = in.ids[:0]
	in.hasIDs = false
	in.text = in.text[:0]
	in.msgs = in.msgs[:0]
	in.textLen = 0
	in.routingStart, in.routingEnd = -1, -1
	in.promptStart, in.promptEnd, in.prompts = 0, 0, 0
	in.stack = in.stack[:0]
}

const promptForms = "prompt: must be a string, an array of token ids, or an array of those"

// parseInference reads a /v1/completions body (chat false) or a
// /v1/chat/completions body (chat true) from s in one pass: the prompt's
// ids or text, or the messages, go into in; every other member is only
// checked for syntax, so that the body can be relayed as it came.
// "prompt", "messages" and "routing" may each appear once: a repeated one
// would leave the engine and kvcar disagreeing on which counts.
func parseInference(s *scanner, in *inference, chat bool, lim inferenceLimits) *requestError {
	c, ok := s.skipSpace()
	if !ok {
		if s.err == nil {
			return badRequest("request body is empty; expected a JSON object")
		}
		return s.endError()
	}
	if c != '{' {
		k, err := s.kindAt(c)
		if err != nil {
			return err
		}
		return badRequest("request body must be a JSON object, got %s", k)
	}
	s.pos++
	var seenPrompt, seenRouting bool
	if c, ok = s.skipSpace(); !ok {
		return s.endError()
	}
	if c == '}' {
		s.pos++
	} else {
		for {
			var kb [maxKeyShown]byte
			n, err := s.memberKey(c, &kb)
			if err != nil {
				return err
			}
			key := kb[:n]
			switch {
			case !chat && string(key) == "prompt", chat && string(key) == "messages":
				if seenPrompt {
					return badRequest("%s: given more than once", string(key))
				}
				seenPrompt = true
				if _, ok := s.skipSpace(); !ok {
					return s.endError()
				}
				in.promptStart = int(s.offset())
				if chat {
					err = s.readMessages(in, lim)
				} else {
					err = s.readPrompt(in, lim)
				}
				in.promptEnd = int(s.offset())
			case string(key) == "routing":
				if seenRouting {
					return badRequest("routing: given more than once")
				}
				seenRouting = true
				if _, ok := s.skipSpace(); !ok {
					return s.endError()
				}
				in.routingStart = int(s.offset())
				in.stack, err = s.skipValue(in.stack)
				in.routingEnd = int(s.offset())
			default:
				in.stack, err = s.skipValue(in.stack)
			}
			if err != nil {
				return err
			}
			var more bool
			if c, more, err = s.afterElement('}'); err != nil {
				return err
			}
			if !more {
				break
			}
		}
	}
	if c, ok := s.skipSpace(); ok {
		return badRequest("unexpected data after the JSON object at offset %d (%s)", s.offset(), strconv.QuoteRune(rune(c)))
	}
	if s.err != nil {
		return s.endError()
	}
	if !seenPrompt {
		if chat {
			return badRequest("messages: must be a non-empty array")
		}
		return badRequest("prompt: required")
	}
	return nil
}

// readPrompt reads a completion's prompt: a string, an array of ids, or
// a batch of either, of which the first is kept and the rest checked.
func (s *scanner) readPrompt(in *inference, lim inferenceLimits) *requestError {
	c, ok := s.skipSpace()
	if !ok {
		return s.endError()
	}
	switch c {
	case '"':
		return s.readPromptText(in, lim)
	case '[':
	default:
		if _, err := s.kindAt(c); err != nil {
			return err
		}
		return badRequest(promptForms)
	}
	s.pos++
	if c, ok = s.skipSpace(); !ok {
		return s.endError()
	}
	in.prompts = 1
	var err *requestError
	switch {
	case c == ']' || c == '-' || (c >= '0' && c <= '9'):
		in.hasIDs = true
		in.ids, err = s.readIDElems(in.ids, lim.maxIDs, "prompt")
		return err
	case c == '"':
		err = s.readPromptText(in, lim)
	case c == '[':
		in.hasIDs = true
		in.ids, err = s.readIDs(in.ids, lim.maxIDs, "prompt[0]")
	default:
		if _, err := s.kindAt(c); err != nil {
			return err
		}
		return badRequest(promptForms)
	}
	if err != nil {
		return err
	}
	// The rest of a batch: routed by its first prompt, so only checked.
	for {
		_, more, err := s.afterElement(']')
		if err != nil || !more {
			return err
		}
		in.prompts++
		if in.stack, err = s.skipValue(in.stack); err != nil {
			return err
		}
	}
}

func (s *scanner) readPromptText(in *inference, lim inferenceLimits) *requestError {
	in.prompts = max(in.prompts, 1)
	var n int
	var err *requestError
	in.text, n, err = s.readString(in.text, lim.keepText, lim.maxText, "prompt")
	in.textLen += n
	return err
}

// readMessages reads a chat's messages array: role and content of each.
func (s *scanner) readMessages(in *inference, lim inferenceLimits) *requestError {
	c, ok := s.skipSpace()
	if !ok {
		return s.endError()
	}
	if c != '[' {
		k, err := s.kindAt(c)
		if err != nil {
			return err
		}
		return badRequest("messages: must be a non-empty array, got %s", k)
	}
	s.pos++
	if c, ok = s.skipSpace(); !ok {
		return s.endError()
	}
	if c == ']' {
		return badRequest("messages: must be a non-empty array")
	}
	for i := 0; ; i++ {
		if c != '{' {
			k, err := s.kindAt(c)
			if err != nil {
				return err
			}
			return badRequest("messages[%d]: must be an object, got %s", i, k)
		}
		if lim.keepText && i >= maxChatMessages {
			return badRequest("messages: more than %d messages", maxChatMessages)
		}
		span, err := s.readMessage(in, lim, i)
		if err != nil {
			return err
		}
		if lim.keepText {
			in.msgs = append(in.msgs, span)
		}
		var more bool
		if c, more, err = s.afterElement(']'); err != nil || !more {
			return err
		}
	}
}

// readMessage reads message i from its '{': "role" must be a string or
// null, "content" is readContent's; other members are checked only. A
// repeated member counts by its last occurrence, as JSON parsers take it.
func (s *scanner) readMessage(in *inference, lim inferenceLimits, i int) (chatSpan, *requestError) {
	span := chatSpan{objStart: int(s.offset())}
	s.pos++
	c, ok := s.skipSpace()
	if !ok {
		return span, s.endError()
	}
	if c == '}' {
		s.pos++
		span.objEnd = int(s.offset())
		return span, nil
	}
	for {
		var kb [maxKeyShown]byte
		n, err := s.memberKey(c, &kb)
		if err != nil {
			return span, err
		}
		switch string(kb[:n]) {
		case "role":
			c, ok := s.skipSpace()
			if !ok {
				return span, s.endError()
			}
			if c != '"' {
				k, err := s.kindAt(c)
				if err != nil {
					return span, err
				}
				if k != "null" {
					return span, badRequest("messages[%d].role: must be a string, got %s", i, k)
				}
				span.roleStart, span.roleEnd = len(in.text), len(in.text)
				break
			}
			start := len(in.text)
			if in.text, _, err = s.readString(in.text, lim.keepText, lim.maxText, "messages"); err != nil {
				return span, err
			}
			span.roleStart, span.roleEnd = start, len(in.text)
		case "content":
			start := len(in.text)
			if err := s.readContent(in, lim, i); err != nil {
				return span, err
			}
			span.contentStart, span.contentEnd = start, len(in.text)
		default:
			span.other = true
			if in.stack, err = s.skipValue(in.stack); err != nil {
				return span, err
			}
		}
		var more bool
		if c, more, err = s.afterElement('}'); err != nil || !more {
			span.objEnd = int(s.offset())
			return span, err
		}
	}
}

const contentForms = "messages[%d].content: must be a string, null or an array of content parts"

// readContent reads a message's content: a string, null, or an array of
// parts of which the {"type":"text","text":…} ones contribute their text,
// one line each, as xllm-service joins them; other parts (images)
// contribute none.
func (s *scanner) readContent(in *inference, lim inferenceLimits, i int) *requestError {
	c, ok := s.skipSpace()
	if !ok {
		return s.endError()
	}
	switch c {
	case '"':
		var n int
		var err *requestError
		in.text, n, err = s.readString(in.text, lim.keepText, lim.maxText, "messages")
		in.textLen += n
		return err
	case '[':
	default:
		k, err := s.kindAt(c)
		if err != nil {
			return err
		}
		if k == "null" {
			return nil
		}
		return badRequest(contentForms, i)
	}
	s.pos++
	if c, ok = s.skipSpace(); !ok {
		return s.endError()
	}
	if c == ']' {
		s.pos++
		return nil
	}
	texts := 0
	for j := 0; ; j++ {
		if c != '{' {
			k, err := s.kindAt(c)
			if err != nil {
				return err
			}
			return badRequest("messages[%d].content[%d]: must be an object, got %s", i, j, k)
		}
		isText, err := s.readPart(in, lim, i, j, texts > 0)
		if err != nil {
			return err
		}
		if isText {
			texts++
		}
		var more bool
		if c, more, err = s.afterElement(']'); err != nil || !more {
			return err
		}
	}
}

// readPart reads content part j of message i from its '{'. Its text is
// kept tentatively and dropped at the end unless its type is "text",
// which may come before or after it; after an earlier text part it
// starts a new line. It reports whether the part is a text part.
func (s *scanner) readPart(in *inference, lim inferenceLimits, i, j int, after bool) (bool, *requestError) {
	s.pos++
	start := len(in.text)
	isText := false
	textLen := 0
	c, ok := s.skipSpace()
	if !ok {
		return false, s.endError()
	}
	if c == '}' {
		s.pos++
		return false, nil
	}
	for {
		var kb [maxKeyShown]byte
		n, err := s.memberKey(c, &kb)
		if err != nil {
			return false, err
		}
		switch string(kb[:n]) {
		case "type":
			c, ok := s.skipSpace()
			if !ok {
				return false, s.endError()
			}
			if c != '"' {
				k, err := s.kindAt(c)
				if err != nil {
					return false, err
				}
				return false, badRequest("messages[%d].content[%d].type: must be a string, got %s", i, j, k)
			}
			var tb [maxKeyShown]byte
			n, err := s.readKey(&tb)
			if err != nil {
				return false, err
			}
			isText = string(tb[:n]) == "text"
		case "text":
			c, ok := s.skipSpace()
			if !ok {
				return false, s.endError()
			}
			if c != '"' {
				if in.stack, err = s.skipValue(in.stack); err != nil {
					return false, err
				}
				break
			}
			// A repeated "text" counts by its last occurrence.
			in.text = in.text[:start]
			if after && lim.keepText {
				in.text = append(in.text, '\n')
			}
			if in.text, textLen, err = s.readString(in.text, lim.keepText, lim.maxText, "messages"); err != nil {
				return false, err
			}
		default:
			if in.stack, err = s.skipValue(in.stack); err != nil {
				return false, err
			}
		}
		var more bool
		if c, more, err = s.afterElement('}'); err != nil {
			return false, err
		}
		if !more {
			if isText {
				in.textLen += textLen
			} else {
				in.text = in.text[:start]
			}
			return isText, nil
		}
	}
}
