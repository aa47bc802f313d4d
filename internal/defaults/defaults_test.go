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

func TestRequirePositive(t *testing.T) {
	if err := RequirePositive("poll interval", time.Second); err != nil {
		t.Errorf("RequirePositive(1s) = %v", err)
	}
	for _, tc := range []struct {
		err  error
		want string
	}{
		{RequirePositive("poll interval", time.Duration(0)), "poll interval 0s: must be positive"},
		{RequirePositive("max connections", -1), "max connections -1: must be positive"},
	} {
		if tc.err == nil || tc.err.Error() != tc.want {
			t.Errorf("got %v, want %q", tc.err, tc.want)
		}
	}
}
