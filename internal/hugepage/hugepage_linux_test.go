package hugepage

import (
	"bufio"
	"os"
	"strconv"
	"strings"
	"testing"
	"unsafe"
)

// TestAdviseMarksTheMapping checks, in the kernel's own account of the
// process's mappings, that the advice took: the mapping holding an
// advised array's middle carries the "hg" flag (MADV_HUGEPAGE), and an
// array under MinBytes is not advised.
func TestAdviseMarksTheMapping(t *testing.T) {
	if _, err := os.Stat("/sys/kernel/mm/transparent_hugepage/enabled"); err != nil {
		t.Skip("this kernel has no transparent huge pages:", err)
	}
	small := make([]uint64, (MinBytes-1)/8)
	if Advise(small) {
		t.Fatalf("an array of %d bytes was advised, under MinBytes (%d)", len(small)*8, MinBytes)
	}
	if Advise([]uint64(nil)) {
		t.Fatal("an empty array was advised")
	}
	big := make([]uint64, 4*MinBytes/8)
	mid := uintptr(unsafe.Pointer(&big[len(big)/2]))
	flags, err := vmFlags(mid)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(" "+flags+" ", " hg ") {
		t.Skipf("the heap's mapping of %#x is advised already (VmFlags %q): nothing to tell apart", mid, flags)
	}
	if !Advise(big) {
		t.Fatal("a 32 MiB array was not advised")
	}
	if flags, err = vmFlags(mid); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(" "+flags+" ", " hg ") {
		t.Fatalf("mapping of %#x has VmFlags %q, want hg", mid, flags)
	}
	for i := range big {
		big[i] = uint64(i)
	}
	if big[len(big)-1] != uint64(len(big)-1) {
		t.Fatal("the advised array does not hold what was written")
	}
}

// vmFlags returns the VmFlags line of the mapping of /proc/self/smaps
// that holds address a.
func vmFlags(a uintptr) (string, error) {
	f, err := os.Open("/proc/self/smaps")
	if err != nil {
		return "", err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	in := false
	for sc.Scan() {
		line := sc.Text()
		if lo, hi, ok := mappingRange(line); ok {
			in = a >= lo && a < hi
			continue
		}
		if in && strings.HasPrefix(line, "VmFlags:") {
			return strings.TrimSpace(strings.TrimPrefix(line, "VmFlags:")), nil
		}
	}
	if err := sc.Err(); err != nil {
		return "", err
	}
	return "", os.ErrNotExist
}

// mappingRange parses a smaps header line, "lo-hi perms offset ...".
func mappingRange(line string) (lo, hi uintptr, ok bool) {
	r, _, found := strings.Cut(line, " ")
	if !found {
		return 0, 0, false
	}
	l, h, found := strings.Cut(r, "-")
	if !found {
		return 0, 0, false
	}
	a, err1 := strconv.ParseUint(l, 16, 64)
	b, err2 := strconv.ParseUint(h, 16, 64)
	if err1 != nil || err2 != nil {
		return 0, 0, false
	}
	return uintptr(a), uintptr(b), true
}
