//go:build !linux || !cgo

package cmalloc

import "errors"

func keep(int, int) bool { return false }

func churn(int, int, int) error { return errors.New("cmalloc: built without cgo") }
