package store

import "testing"

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
		ok   bool
	}{
		{"defaults", Config{HTTPAddr: DefaultHTTPAddr}, true},
		{"ipv6 loopback", Config{HTTPAddr: "[::1]:8123"}, true},
		{"localhost", Config{HTTPAddr: "localhost:8123"}, true},
		{"disabled", Config{}, true},
		{"all ipv4 interfaces", Config{HTTPAddr: "0.0.0.0:8123"}, false},
		{"all interfaces", Config{HTTPAddr: ":8123"}, false},
		{"lab ipv6 address", Config{HTTPAddr: "[fd00:10::1]:8123"}, false},
		{"lab ipv4 address", Config{HTTPAddr: "198.18.0.1:8123"}, false},
		{"password in dsn", Config{DSN: "clickhouse://u:p@127.0.0.1:9000/?password=x"}, false},
		{"bad database", Config{Database: "a;b"}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.cfg.SetDefaults()
			if err := tt.cfg.Validate(); (err == nil) != tt.ok {
				t.Errorf("Validate() = %v, want ok=%v", err, tt.ok)
			}
		})
	}
}

func TestParseByteSize(t *testing.T) {
	tests := []struct {
		in   string
		want uint64
		ok   bool
	}{
		{"1048576", 1 << 20, true}, {"512MiB", 512 << 20, true}, {"2GB", 2e9, true}, {"1.5GiB", 3 << 29, true},
		{"-1", 0, false}, {"lots", 0, false},
	}
	for _, tt := range tests {
		got, err := ParseByteSize(tt.in)
		if (err == nil) != tt.ok || got != tt.want {
			t.Errorf("ParseByteSize(%q) = %d, %v; want %d ok=%v", tt.in, got, err, tt.want, tt.ok)
		}
	}
}
