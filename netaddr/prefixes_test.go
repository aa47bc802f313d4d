package netaddr

import "testing"

func TestPrefixList(t *testing.T) {
	tests := []struct {
		in, want string
		ok       bool
	}{
		{"198.18.0.0/16", "198.18.0.0/16", true},
		{"fd00:10::/56", "fd00:10::/56", true},
		{" 198.18.1.7/24 , fd00:10:0:1::5/64 ,", "198.18.1.0/24,fd00:10:0:1::/64", true},
		{"198.18.0.0/16,198.18.3.4/16,fd00:10::/32,fd00:10::1/32", "198.18.0.0/16,fd00:10::/32", true},
		{"", "", true},
		{"198.18.0.0", "", false},
		{"fd00:10::/129", "", false},
	}
	for _, tt := range tests {
		var p PrefixList
		err := p.Set(tt.in)
		if (err == nil) != tt.ok {
			t.Errorf("Set(%q) error %v, want ok=%v", tt.in, err, tt.ok)
			continue
		}
		if tt.ok && p.String() != tt.want {
			t.Errorf("Set(%q) = %q, want %q", tt.in, p.String(), tt.want)
		}
	}
}

func TestHostAllowed(t *testing.T) {
	names := []string{"dualflow.example.", "Flows.Corp"}
	for _, tc := range []struct {
		host string
		ok   bool
	}{
		{"127.0.0.1:8080", true},
		{"127.0.0.1", true},
		{"[::1]:8080", true},
		{"::1", true},
		{"198.18.0.1:8080", true},
		{"[fd00:10::1]:8123", true},
		{"localhost:8080", true},
		{"LOCALHOST", true},
		{"ui.localhost:8080", true},
		{"dualflow.example:8080", true},
		{"flows.corp", true},
		{"flows.corp.", true},
		{"attacker.example:8080", false},
		{"127.0.0.1.nip.io:8080", false},
		{"localhost.attacker.example", false},
		{"[fe80::1%eth0]:80", false},
		{"", false},
		{":8080", false},
	} {
		if got := HostAllowed(tc.host, names); got != tc.ok {
			t.Errorf("HostAllowed(%q) = %v, want %v", tc.host, got, tc.ok)
		}
	}
}
