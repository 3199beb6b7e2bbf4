package server

import (
	"bytes"
	"encoding/json"
	"math"
	"testing"
)

// FuzzQueryRequest compares the streaming request parser with
// encoding/json (R-API-5). Where encoding/json rejects a body, or
// accepts it with an id outside uint32, the parser must reject it; where
// encoding/json accepts a body whose only member is one "token_ids"
// array of in-range ids, the parser must accept the same ids. Deliberate
// differences, checked only in the first direction: unknown members,
// case-insensitive key matching, repeated keys and "token_ids": null or
// missing, all of which encoding/json accepts and the parser rejects.
func FuzzQueryRequest(f *testing.F) {
	for _, s := range []string{
		`{"token_ids":[1,2,3,4]}`, `{"token_ids":[]}`, ` {"token_ids" : [ 0 , -0 ,4294967295 ] } `,
		`{"token\u005fids":[7]}`, `{"token_ids":[4294967296]}`, `{"token_ids":[-1]}`, `{"token_ids":[1.5]}`,
		`{"token_ids":[1e3]}`, `{"token_ids":["1"]}`, `{"token_ids":null}`, `{}`, `{"TOKEN_IDS":[1]}`,
		`{"token_ids":[1],"token_ids":[2]}`, `{"token_ids":[1],"x":2}`, `{"token_ids":[1]} x`, `[1]`, ``,
		`{"token_ids":[01]}`, `{"token_ids":[1,]}`, `{"token_ids":[99999999999999999999]}`,
	} {
		f.Add([]byte(s), uint8(0))
	}
	f.Fuzz(func(t *testing.T, body []byte, chunk uint8) {
		// Small chunks move every token across buffer boundaries.
		sc := scanner{r: bytes.NewReader(body), buf: make([]byte, 1+int(chunk)%64), limit: math.MaxInt64}
		got, perr := parseQuery(&sc, nil, math.MaxInt32)

		ref, inRange, refErr := jsonTokenIDs(body)
		if perr == nil {
			if !inRange {
				t.Fatalf("accepted %q (ids %v), encoding/json: %v / ids %v", body, got, refErr, ref)
			}
			if len(got) != len(ref) {
				t.Fatalf("%q: ids %v, encoding/json %v", body, got, ref)
			}
			for i := range got {
				if int64(got[i]) != ref[i] {
					t.Fatalf("%q: ids %v, encoding/json %v", body, got, ref)
				}
			}
			return
		}
		if perr.status != 400 || perr.message == "" {
			t.Fatalf("%q: unexpected rejection %d %q", body, perr.status, perr.message)
		}
		if inRange && ref != nil && onlyTokenIDs(body) {
			t.Fatalf("rejected %q (%s), encoding/json accepts ids %v", body, perr.message, ref)
		}
	})
}

// jsonTokenIDs decodes {"token_ids":[...]} with encoding/json, the
// parser's reference, and reports whether it decoded with every id in
// the uint32 range.
func jsonTokenIDs(body []byte) (ids []int64, inRange bool, err error) {
	var ref struct {
		TokenIDs []int64 `json:"token_ids"`
	}
	err = json.Unmarshal(body, &ref)
	inRange = err == nil
	for _, id := range ref.TokenIDs {
		if id < 0 || id > math.MaxUint32 {
			inRange = false
		}
	}
	return ref.TokenIDs, inRange, err
}

// onlyTokenIDs reports whether body is an object whose one member is
// spelt exactly token_ids, the form on which the parser and encoding/json
// must agree.
func onlyTokenIDs(body []byte) bool {
	var members map[string]json.RawMessage
	if json.Unmarshal(body, &members) != nil || len(members) != 1 {
		return false
	}
	if _, ok := members["token_ids"]; !ok {
		return false
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	keys := 0
	depth := 0
	for {
		tok, err := dec.Token()
		if err != nil {
			break
		}
		switch v := tok.(type) {
		case json.Delim:
			if v == '{' || v == '[' {
				depth++
			} else {
				depth--
			}
		case string:
			if depth == 1 {
				keys++
				var raw json.RawMessage
				if dec.Decode(&raw) != nil {
					return false
				}
			}
		}
	}
	return keys == 1
}
