package tokenizer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/ardanlabs/jinja"
)

// ErrNoChatTemplate is returned by the chat methods when the tokenizer
// directory has no chat template.
var ErrNoChatTemplate = errors.New("tokenizer has no chat template")

// Message is one chat message as the template sees it: message['role'] and
// message['content'].
type Message struct {
	Role    string
	Content string
}

// ChatOptions controls rendering and encoding of a conversation.
type ChatOptions struct {
	// AddGenerationPrompt sets the template's add_generation_prompt, which
	// makes it open an assistant turn at the end.
	AddGenerationPrompt bool
	// AddSpecialTokens encodes the rendered prompt as Encode does (the
	// post_processor and add_bos_token / add_eos_token apply on top of
	// whatever the template wrote). Leave it false for the HuggingFace and
	// vLLM convention, where the template alone places BOS.
	AddSpecialTokens bool
	// Kwargs are extra template variables, the request's
	// chat_template_kwargs (for example "enable_thinking": false).
	Kwargs map[string]any
}

// tokenizerConfig is what is taken from tokenizer_config.json and the chat
// template files.
type tokenizerConfig struct {
	tokens         map[string]string
	addBOS, addEOS bool
	template       string
	templateFile   string
}

type tokenizerConfigJSON struct {
	ChatTemplate json.RawMessage `json:"chat_template"`
	AddBOSToken  *bool           `json:"add_bos_token"`
	AddEOSToken  *bool           `json:"add_eos_token"`
	BOSToken     json.RawMessage `json:"bos_token"`
	EOSToken     json.RawMessage `json:"eos_token"`
	UNKToken     json.RawMessage `json:"unk_token"`
	PADToken     json.RawMessage `json:"pad_token"`
}

// parseSpecialToken accepts null, a string, or an AddedToken object
// ({"content": ...}).
func parseSpecialToken(sp spec, path string, raw json.RawMessage) (string, bool, error) {
	if isNull(raw) {
		return "", false, nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s, true, nil
	}
	var obj struct {
		Content *string `json:"content"`
	}
	if err := json.Unmarshal(raw, &obj); err != nil || obj.Content == nil {
		return "", false, sp.invalid(path, "neither a string nor an object with content")
	}
	return *obj.Content, true, nil
}

// parseChatTemplate accepts a string or a list of {"name", "template"},
// from which "default" is taken, as transformers does.
func parseChatTemplate(sp spec, raw json.RawMessage) (string, error) {
	if isNull(raw) {
		return "", nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s, nil
	}
	var named []struct {
		Name     string `json:"name"`
		Template string `json:"template"`
	}
	if err := json.Unmarshal(raw, &named); err != nil {
		return "", sp.invalid("chat_template", "neither a string nor a list of named templates")
	}
	for _, n := range named {
		if n.Name == "default" {
			return n.Template, nil
		}
	}
	return "", sp.unsupported("chat_template", "named chat templates without a \"default\" one")
}

// loadConfig reads tokenizer_config.json (optional) and the chat template,
// looked up as the xLLM service does: chat_template.json, then
// chat_template.jinja, then tokenizer_config.json's chat_template.
func loadConfig(dir string) (tokenizerConfig, error) {
	cfg := tokenizerConfig{tokens: map[string]string{}}
	path := filepath.Join(dir, "tokenizer_config.json")
	if fileExists(path) {
		data, err := os.ReadFile(path)
		if err != nil {
			return cfg, fmt.Errorf("read tokenizer config: %w", err)
		}
		var cj tokenizerConfigJSON
		if err := json.Unmarshal(data, &cj); err != nil {
			return cfg, fmt.Errorf("%s: parse: %w", path, err)
		}
		sp := spec{file: path}
		for name, raw := range map[string]json.RawMessage{
			"bos_token": cj.BOSToken, "eos_token": cj.EOSToken,
			"unk_token": cj.UNKToken, "pad_token": cj.PADToken,
		} {
			text, ok, err := parseSpecialToken(sp, name, raw)
			if err != nil {
				return cfg, err
			}
			if ok {
				cfg.tokens[name] = text
			}
		}
		cfg.addBOS = cj.AddBOSToken != nil && *cj.AddBOSToken
		cfg.addEOS = cj.AddEOSToken != nil && *cj.AddEOSToken
		if cfg.template, err = parseChatTemplate(sp, cj.ChatTemplate); err != nil {
			return cfg, err
		}
		cfg.templateFile = path
	}
	if p := filepath.Join(dir, "chat_template.jinja"); fileExists(p) {
		data, err := os.ReadFile(p)
		if err != nil {
			return cfg, fmt.Errorf("read chat template: %w", err)
		}
		cfg.template, cfg.templateFile = string(data), p
	}
	if p := filepath.Join(dir, "chat_template.json"); fileExists(p) {
		data, err := os.ReadFile(p)
		if err != nil {
			return cfg, fmt.Errorf("read chat template: %w", err)
		}
		var cj struct {
			ChatTemplate json.RawMessage `json:"chat_template"`
		}
		if err := json.Unmarshal(data, &cj); err != nil {
			return cfg, fmt.Errorf("%s: parse: %w", p, err)
		}
		tmpl, err := parseChatTemplate(spec{file: p}, cj.ChatTemplate)
		if err != nil {
			return cfg, err
		}
		if tmpl != "" {
			cfg.template, cfg.templateFile = tmpl, p
		}
	}
	return cfg, nil
}

// compileTemplate prepares template source the way Jinja's lexer does before
// compiling it: every newline becomes "\n" and a single trailing newline is
// dropped (keep_trailing_newline is off in HuggingFace's environment). The
// template engine already applies trim_blocks and lstrip_blocks.
func compileTemplate(src string) (*jinja.Template, error) {
	src = strings.ReplaceAll(src, "\r\n", "\n")
	src = strings.ReplaceAll(src, "\r", "\n")
	src = strings.TrimSuffix(src, "\n")
	return jinja.Compile(src)
}

// ApplyChatTemplate renders messages with the model's chat template, with
// add_generation_prompt as given.
func (t *Tokenizer) ApplyChatTemplate(messages []Message, addGenerationPrompt bool) (string, error) {
	return t.RenderChat(messages, ChatOptions{AddGenerationPrompt: addGenerationPrompt})
}

// RenderChat renders messages with the chat template; AddSpecialTokens is
// ignored.
func (t *Tokenizer) RenderChat(messages []Message, opts ChatOptions) (string, error) {
	if t.tmpl == nil {
		return "", fmt.Errorf("%s: %w", t.dir, ErrNoChatTemplate)
	}
	data := make(map[string]any, len(t.tokens)+len(opts.Kwargs)+4)
	for k, v := range t.tokens {
		data[k] = v
	}
	// HuggingFace passes tools and documents as None when absent.
	data["tools"] = nil
	data["documents"] = nil
	for k, v := range opts.Kwargs {
		data[k] = v
	}
	msgs := make([]any, len(messages))
	for i, m := range messages {
		msgs[i] = map[string]any{"role": m.Role, "content": m.Content}
	}
	data["messages"] = msgs
	data["add_generation_prompt"] = opts.AddGenerationPrompt
	out, err := t.tmpl.Render(data)
	if err != nil {
		return "", fmt.Errorf("render chat template: %w", err)
	}
	return out, nil
}

// EncodeChat renders messages with add_generation_prompt=true and appends
// the ids of the result to dst, without adding special tokens beyond what
// the template writes. See EncodeChatWith for the other convention.
func (t *Tokenizer) EncodeChat(messages []Message, dst []uint32) ([]uint32, error) {
	return t.EncodeChatWith(messages, ChatOptions{AddGenerationPrompt: true}, dst)
}

// EncodeChatWith renders and encodes messages with explicit options.
func (t *Tokenizer) EncodeChatWith(messages []Message, opts ChatOptions, dst []uint32) ([]uint32, error) {
	return t.encodeChat(context.Background(), messages, opts, dst)
}

// EncodeChatContext is EncodeChat that gives up once ctx ends, as
// EncodeContext does. Rendering the template is not interrupted: its
// cost is linear in the messages, which the caller bounds.
func (t *Tokenizer) EncodeChatContext(ctx context.Context, messages []Message, dst []uint32) ([]uint32, error) {
	return t.encodeChat(ctx, messages, ChatOptions{AddGenerationPrompt: true}, dst)
}

// EncodeChatWithContext is EncodeChatWith that gives up once ctx ends.
func (t *Tokenizer) EncodeChatWithContext(ctx context.Context, messages []Message, opts ChatOptions, dst []uint32) ([]uint32, error) {
	return t.encodeChat(ctx, messages, opts, dst)
}

func (t *Tokenizer) encodeChat(ctx context.Context, messages []Message, opts ChatOptions, dst []uint32) ([]uint32, error) {
	prompt, err := t.RenderChat(messages, opts)
	if err != nil {
		return dst, err
	}
	return t.encode(ctx, prompt, EncodeOptions{AddSpecialTokens: opts.AddSpecialTokens}, dst)
}
