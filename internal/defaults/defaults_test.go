package defaults

import (
	"testing"
	"time"
)

func TestPositive(t *testing.T) {
	if got := Positive(0, 5); got != 5 {
		t.Errorf("Positive(0, 5) = %d", got)
	}
	if got := Positive(-1, 5); got != 5 {
		t.Errorf("Positive(-1, 5) = %d", got)
	}
	if got := Positive(3, 5); got != 3 {
		t.Errorf("Positive(3, 5) = %d", got)
	}
	if got := Positive(time.Duration(0), time.Second); got != time.Second {
		t.Errorf("Positive(0s, 1s) = %v", got)
	}
}
