package labcmd

import (
	"flag"
	"io"
	"net"
	"reflect"
	"testing"

	"github.com/dualflow/dualflow/app"
)

// TestDemoListeners: the demo listens on loopback TCP by default, and
// honors --collector.ipfix.tcp-addr and udp-addr when given.
func TestDemoListeners(t *testing.T) {
	loopback := []string{"127.0.0.1:4739", "[::1]:4739"}
	for _, tc := range []struct {
		name     string
		args     []string
		tcp, udp []string
		wantErr  bool
	}{
		{"default", nil, loopback, nil, false},
		{"tcp ipv4", []string{"--collector.ipfix.tcp-addr", "127.0.0.1:5000"}, []string{"127.0.0.1:5000"}, nil, false},
		{"tcp ipv6 and any", []string{"--collector.ipfix.tcp-addr", "[::1]:5000,:5001"}, []string{"[::1]:5000", ":5001"}, nil, false},
		{"udp added", []string{"--collector.ipfix.udp-addr", "[::1]:5002"}, loopback, []string{"[::1]:5002"}, false},
		{"udp only", []string{"--collector.ipfix.tcp-addr=", "--collector.ipfix.udp-addr", "127.0.0.1:5002"}, nil, []string{"127.0.0.1:5002"}, false},
		{"none", []string{"--collector.ipfix.tcp-addr=", "--collector.ipfix.udp-addr="}, nil, nil, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fs := flag.NewFlagSet("demo", flag.ContinueOnError)
			fs.SetOutput(io.Discard)
			var acfg app.Config
			acfg.BindFlags(fs)
			if err := fs.Parse(tc.args); err != nil {
				t.Fatal(err)
			}
			ic := &acfg.Collector.IPFIX
			err := demoListeners(fs, ic)
			if (err != nil) != tc.wantErr {
				t.Fatalf("demoListeners: %v", err)
			}
			if err != nil {
				return
			}
			if !reflect.DeepEqual(ic.TCPAddrs, tc.tcp) || !reflect.DeepEqual(ic.UDPAddrs, tc.udp) {
				t.Errorf("tcp %q udp %q, want %q %q", ic.TCPAddrs, ic.UDPAddrs, tc.tcp, tc.udp)
			}
		})
	}
}

// TestDemoTarget: the lab's exporters send to a bound listener, TCP first,
// in the lab's preferred family; a listener on every address is reached
// on loopback.
func TestDemoTarget(t *testing.T) {
	tcp := func(s string) net.Addr { a, _ := net.ResolveTCPAddr("tcp", s); return a }
	udp := func(s string) net.Addr { a, _ := net.ResolveUDPAddr("udp", s); return a }
	for _, tc := range []struct {
		name      string
		bound     map[string][]net.Addr
		ipv6      bool
		addr, tr  string
		wantError bool
	}{
		{"demo default, dual-stack lab", map[string][]net.Addr{"tcp": {tcp("127.0.0.1:4739"), tcp("[::1]:4739")}}, true, "[::1]:4739", "tcp", false},
		{"demo default, ipv4 lab", map[string][]net.Addr{"tcp": {tcp("127.0.0.1:4739"), tcp("[::1]:4739")}}, false, "127.0.0.1:4739", "tcp", false},
		{"ipv4 listener only, ipv6 lab", map[string][]net.Addr{"tcp": {tcp("127.0.0.1:5000")}}, true, "127.0.0.1:5000", "tcp", false},
		{"any address, ipv6", map[string][]net.Addr{"tcp": {tcp("[::]:5000")}}, true, "[::1]:5000", "tcp", false},
		{"any address, ipv4", map[string][]net.Addr{"tcp": {tcp("[::]:5000")}}, false, "127.0.0.1:5000", "tcp", false},
		{"ipv4 any address, ipv6 lab", map[string][]net.Addr{"tcp": {tcp("0.0.0.0:5000")}}, true, "127.0.0.1:5000", "tcp", false},
		{"tcp before udp", map[string][]net.Addr{"udp": {udp("[::1]:5001")}, "tcp": {tcp("198.18.0.1:5000")}}, true, "198.18.0.1:5000", "tcp", false},
		{"udp only", map[string][]net.Addr{"tcp": nil, "udp": {udp("[fd00:10::1]:5001")}}, true, "[fd00:10::1]:5001", "udp", false},
		{"tls only", map[string][]net.Addr{"tls": {tcp("127.0.0.1:4740")}}, true, "", "", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			addr, tr, err := demoTarget(tc.bound, tc.ipv6)
			if (err != nil) != tc.wantError || addr != tc.addr || tr != tc.tr {
				t.Errorf("demoTarget = %q, %q, %v; want %q, %q", addr, tr, err, tc.addr, tc.tr)
			}
		})
	}
}
