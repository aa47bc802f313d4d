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
