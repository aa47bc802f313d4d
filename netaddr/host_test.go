package netaddr

import "testing"

func TestLoopback(t *testing.T) {
	for _, tc := range []struct {
		host string
		want bool
	}{
		{"localhost", true},
		{"LocalHost", true},
		{"127.0.0.1", true},
		{"127.1.2.3", true},
		{"::1", true},
		{"::ffff:127.0.0.1", true},
		{"10.0.0.1", false},
		{"fd00::1", false},
		{"localhost.example", false},
		{"", false},
	} {
		if got := Loopback(tc.host); got != tc.want {
			t.Errorf("Loopback(%q) = %v, want %v", tc.host, got, tc.want)
		}
	}
}
