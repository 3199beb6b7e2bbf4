package kvevent

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvcar/kvcar/internal/tokenizer"
	"github.com/tinylib/msgp/msgp"
)

var (
	textTokenizer = flag.String("text_tokenizer", "", "a tokenizer directory: BenchmarkDecodeText tokenizes -text_files with it")
	textFiles     = flag.String("text_files", "", "comma-separated globs of the text files BenchmarkDecodeText reads")
)

// BenchmarkDecodeText reads token_ids arrays of 8,192 ids of real text,
// each array in turn: the text of -text_files, tokenized with the
// tokenizer in -text_tokenizer and cut into arrays (the ids, not a model
// of their widths). "each" reads every id with a branch on its encoding
// (readEachToken alone, as the decoder did before readIDs); "walk" is
// readTokens' way, readIDs first. It needs both flags, for example
//
//	go test ./internal/kvevent -run '^$' -bench DecodeText \
//	  -text_tokenizer=.cache/tokenizers/qwen3 -text_files='../../internal/*/*.go,../../README.md'
//
// (paths relative to the package directory).
func BenchmarkDecodeText(b *testing.B) {
	if *textTokenizer == "" || *textFiles == "" {
		b.Skip("needs -text_tokenizer and -text_files")
	}
	tk, err := tokenizer.Load(*textTokenizer)
	if err != nil {
		b.Fatal(err)
	}
	var ids []uint32
	for _, pattern := range strings.Split(*textFiles, ",") {
		files, err := filepath.Glob(pattern)
		if err != nil {
			b.Fatal(err)
		}
		for _, f := range files {
			text, err := os.ReadFile(f)
			if err != nil {
				b.Fatal(err)
			}
			if ids, err = tk.Encode(string(text), ids); err != nil {
				b.Fatalf("%s: %v", f, err)
			}
		}
	}
	const perArray = 8192
	var arrays [][]byte
	for off := 0; off+perArray <= len(ids); off += perArray {
		p := msgp.AppendArrayHeader(nil, perArray)
		for _, id := range ids[off : off+perArray] {
			p = msgp.AppendUint32(p, id)
		}
		arrays = append(arrays, p)
	}
	if len(arrays) == 0 {
		b.Fatalf("%d ids, fewer than one array of %d", len(ids), perArray)
	}
	dst := make([]uint32, perArray)
	sc := new(walkScratch)
	for _, walk := range []bool{false, true} {
		name := "each"
		if walk {
			name = "walk"
		}
		b.Run(name, func(b *testing.B) {
			i := 0
			for b.Loop() {
				_, p, err := msgp.ReadArrayHeaderBytes(arrays[i%len(arrays)])
				if err != nil {
					b.Fatal(err)
				}
				i++
				read := 0
				if walk {
					read, p = readIDs(p, dst, sc)
				}
				if _, _, err := readEachToken(p, dst, read); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/perArray, "ns/id")
			b.ReportMetric(float64(len(arrays)), "arrays")
		})
	}
}
