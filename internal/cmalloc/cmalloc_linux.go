//go:build linux && cgo

package cmalloc

/*
#include <stdlib.h>
#include <string.h>
#include <malloc.h>

static int kvcar_keep(int mmap_threshold, int trim_threshold) {
#if defined(M_MMAP_THRESHOLD) && defined(M_TRIM_THRESHOLD)
	return mallopt(M_MMAP_THRESHOLD, mmap_threshold) == 1 && mallopt(M_TRIM_THRESHOLD, trim_threshold) == 1;
#else
	return 0;
#endif
}

// kvcar_churn allocates, writes and frees n buffers of size bytes at a
// time, rounds times, as libzmq's messages come and go.
static int kvcar_churn(size_t size, int n, int rounds) {
	void *p[64];
	if (n > 64) return -1;
	for (int r = 0; r < rounds; r++) {
		for (int i = 0; i < n; i++) {
			p[i] = malloc(size);
			if (p[i] == NULL) return -1;
			memset(p[i], r, size);
		}
		for (int i = 0; i < n; i++) free(p[i]);
	}
	return 0;
}
*/
import "C"

import "errors"

func keep(mmapThreshold, trimThreshold int) bool {
	return C.kvcar_keep(C.int(mmapThreshold), C.int(trimThreshold)) == 1
}

// churn allocates, writes and frees n buffers of size bytes at a time,
// rounds times, in C: how the tests show what Keep changes.
func churn(size, n, rounds int) error {
	if C.kvcar_churn(C.size_t(size), C.int(n), C.int(rounds)) != 0 {
		return errors.New("cmalloc: churn failed")
	}
	return nil
}
