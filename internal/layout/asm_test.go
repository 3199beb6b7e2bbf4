package layout

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// An amd64 assembly function that writes 256- or 512-bit registers must
// not execute legacy-encoded SSE instructions (PXOR, MOVOU, MOVQ AX, X0,
// ...): on Intel processors each one met with the upper halves in use
// costs a state change, and kvevent's AVX2 width fill, which set its
// constants that way, took 1.1 µs a call of 96 bytes instead of 21 ns
// (kvevent.BenchmarkFill). The VEX forms (VPXOR, VMOVDQU, VMOVQ) cost
// nothing extra. Macros are expanded with their arguments, since a
// macro's body names the registers its caller passes.
func TestAssemblyKeepsVEXWithWideRegisters(t *testing.T) {
	root := filepath.Join("..", "..")
	checked := 0
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "testdata" || d.Name() == "node_modules") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, "_amd64.s") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		checked++
		for _, p := range mixedSSE(string(src)) {
			t.Errorf("%s: %s", path, p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if checked == 0 {
		t.Fatal("no amd64 assembly found: the walk starts in the wrong place")
	}
}

// The check catches what it is for, in a macro's argument as in a
// function's own line, and passes VEX code.
func TestMixedSSEFires(t *testing.T) {
	src := `
#define SPLAT(b, X, Y) \
	MOVQ	$b, AX \
	MOVQ	AX, X \
	VPBROADCASTQ	X, Y

#define SPLATV(b, X, Y) \
	MOVQ	$b, AX \
	VMOVQ	AX, X \
	VPBROADCASTQ	X, Y

TEXT ·viaMacro(SB), NOSPLIT, $0-8
	SPLAT(1, X8, Y8)
	VZEROUPPER
	RET

TEXT ·direct(SB), NOSPLIT, $0-8
	VPXOR	Y0, Y0, Y0
	PXOR	X1, X1 // a comment: Y2
	VZEROUPPER
	RET

TEXT ·clean(SB), NOSPLIT, $0-8
	SPLATV(1, X8, Z8)
	VZEROUPPER
	RET

TEXT ·narrow(SB), NOSPLIT, $0-8
	PXOR	X1, X1
	RET
`
	got := mixedSSE(src)
	if len(got) != 2 || !strings.Contains(got[0], "viaMacro") || !strings.Contains(got[0], "MOVQ AX, X8") ||
		!strings.Contains(got[1], "direct") || !strings.Contains(got[1], "PXOR X1, X1") {
		t.Errorf("mixedSSE found %q, want viaMacro's MOVQ AX, X8 and direct's PXOR", got)
	}
}

var (
	wideReg = regexp.MustCompile(`\b[YZ]([0-9]|[12][0-9]|3[01])\b`)
	xmmReg  = regexp.MustCompile(`\bX([0-9]|[12][0-9]|3[01])\b`)
	defRe   = regexp.MustCompile(`^#define\s+(\w+)(\(([^)]*)\))?\s*(.*)$`)
	textRe  = regexp.MustCompile(`^TEXT\s+\S*·(\w+)`)
)

type macro struct {
	params []string
	body   []string
}

// mixedSSE returns, for each function of src that uses a Y or Z
// register, its first legacy SSE instruction: one whose mnemonic has no
// V prefix (nor K, the mask instructions) and that names an X register.
func mixedSSE(src string) []string {
	lines := joinContinued(src)
	macros := map[string]macro{}
	var problems []string
	fn, wide, first := "", false, ""
	end := func() {
		if fn != "" && wide && first != "" {
			problems = append(problems, fn+" writes wide registers and runs legacy SSE: "+first)
		}
	}
	for _, l := range lines {
		if m := defRe.FindStringSubmatch(l); m != nil {
			var params []string
			for p := range strings.SplitSeq(m[3], ",") {
				if p = strings.TrimSpace(p); p != "" {
					params = append(params, p)
				}
			}
			macros[m[1]] = macro{params, splitInstructions(m[4])}
			continue
		}
		if m := textRe.FindStringSubmatch(l); m != nil {
			end()
			fn, wide, first = m[1], false, ""
			continue
		}
		if fn == "" {
			continue
		}
		for _, ins := range expand(l, macros, 0) {
			if wideReg.MatchString(ins) {
				wide = true
			}
			if first == "" && legacySSE(ins) {
				first = ins
			}
		}
	}
	end()
	return problems
}

// joinContinued returns src's lines without comments, a line ending in
// a backslash joined with the next, as the assembler's preprocessor does.
func joinContinued(src string) []string {
	var out []string
	var cur strings.Builder
	for l := range strings.SplitSeq(src, "\n") {
		if i := strings.Index(l, "//"); i >= 0 {
			l = l[:i]
		}
		l = strings.TrimRight(l, " \t")
		if rest, ok := strings.CutSuffix(l, `\`); ok {
			cur.WriteString(rest)
			cur.WriteString(" ; ")
			continue
		}
		cur.WriteString(l)
		out = append(out, strings.TrimSpace(cur.String()))
		cur.Reset()
	}
	return out
}

// splitInstructions splits a joined macro body into its instructions.
func splitInstructions(body string) []string {
	var out []string
	for ins := range strings.SplitSeq(body, ";") {
		if ins = strings.Join(strings.Fields(ins), " "); ins != "" {
			out = append(out, ins)
		}
	}
	return out
}

// expand returns line's instructions, a macro's replaced by its body
// with its arguments in place of its parameters.
func expand(line string, macros map[string]macro, depth int) []string {
	var out []string
	for _, ins := range splitInstructions(line) {
		name, rest, called := strings.Cut(ins, "(")
		m, ok := macros[strings.TrimSpace(name)]
		if !ok || depth > 8 {
			out = append(out, ins)
			continue
		}
		var args []string
		if called {
			args = splitArgs(strings.TrimSuffix(strings.TrimSpace(rest), ")"))
		}
		for _, b := range m.body {
			for i, p := range m.params {
				if i < len(args) {
					b = regexp.MustCompile(`\b`+regexp.QuoteMeta(p)+`\b`).ReplaceAllString(b, args[i])
				}
			}
			out = append(out, expand(b, macros, depth+1)...)
		}
	}
	return out
}

// splitArgs splits a macro call's arguments at the commas outside
// parentheses: WIDTHS32((SI), Y0, Y3, Y4) has four.
func splitArgs(s string) []string {
	var args []string
	depth, start := 0, 0
	for i, c := range s {
		switch c {
		case '(':
			depth++
		case ')':
			depth--
		case ',':
			if depth == 0 {
				args = append(args, strings.TrimSpace(s[start:i]))
				start = i + 1
			}
		}
	}
	return append(args, strings.TrimSpace(s[start:]))
}

// legacySSE reports whether ins is a legacy-encoded SSE instruction.
func legacySSE(ins string) bool {
	mnemonic, operands, _ := strings.Cut(ins, " ")
	if mnemonic == "" || strings.HasPrefix(mnemonic, "V") || strings.HasPrefix(mnemonic, "K") {
		return false
	}
	return xmmReg.MatchString(operands)
}
