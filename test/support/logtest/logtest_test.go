package logtest

import (
	"sync"
	"testing"
)

func TestLines(t *testing.T) {
	var b Buffer
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() { b.Logger().Info("hello", "i", i) })
	}
	wg.Wait()
	if n := len(b.Lines("msg=hello")); n != 8 {
		t.Fatalf("%d lines, want 8:\n%s", n, b.String())
	}
	if n := len(b.Lines("absent")); n != 0 {
		t.Fatalf("%d lines of absent", n)
	}
}
