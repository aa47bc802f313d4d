package agent

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// freePort returns a port that is free on loopback for both TCP and UDP.
func freePort(t *testing.T) uint16 {
	t.Helper()
	for range 20 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		p := l.Addr().(*net.TCPAddr).Port
		l.Close()
		if c, err := net.ListenPacket("udp", ":"+strconv.Itoa(p)); err == nil {
			c.Close()
			return uint16(p)
		}
	}
	t.Fatal("no free port")
	return 0
}

// TestServeAndDial runs a server in the current namespace and dials it over
// loopback in both families (no root needed).
func TestServeAndDial(t *testing.T) {
	// The port was free when freePort looked; another process may take it
	// before Listen binds it (every address, both families): try another.
	var port uint16
	var srv *Server
	var err error
	for range 20 {
		port = freePort(t)
		srv, err = Listen(ServerConfig{Name: "ns/pod", TCP: []uint16{port}, UDP: []uint16{port}})
		if !errors.Is(err, syscall.EADDRINUSE) {
			break
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	tests := []struct {
		name  string
		proto string
		to    netip.AddrPort
	}{
		{"tcp ipv4", TCP, netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), port)},
		{"tcp ipv6", TCP, netip.AddrPortFrom(netip.IPv6Loopback(), port)},
		{"udp ipv4", UDP, netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), port)},
		{"udp ipv6", UDP, netip.AddrPortFrom(netip.IPv6Loopback(), port)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r, err := Dial(context.Background(), "", tc.proto, tc.to, 2*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			if r.Server != "ns/pod" {
				t.Errorf("server %q", r.Server)
			}
			if r.Seen != r.Local || r.Seen.Addr() != tc.to.Addr() {
				t.Errorf("seen %s, local %s: want the same unmapped %s address", r.Seen, r.Local, tc.to.Addr())
			}
		})
	}
}

func TestDialNoAnswer(t *testing.T) {
	// A UDP socket that never answers: the client must time out with ErrNoAnswer.
	c, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	to := c.LocalAddr().(*net.UDPAddr).AddrPort()
	_, err = Dial(context.Background(), "", UDP, to, 100*time.Millisecond)
	if !errors.Is(err, ErrNoAnswer) {
		t.Fatalf("want ErrNoAnswer, got %v", err)
	}
}

func TestDialUnknownProto(t *testing.T) {
	if _, err := Dial(context.Background(), "", "sctp", netip.MustParseAddrPort("127.0.0.1:1"), time.Second); err == nil {
		t.Fatal("want an error")
	}
}

func TestParseReply(t *testing.T) {
	tests := []struct {
		line string
		name string
		addr netip.AddrPort
		ok   bool
	}{
		{"backend/api 198.18.1.10:40000\n", "backend/api", netip.MustParseAddrPort("198.18.1.10:40000"), true},
		{"backend/api [fd00:10:0:1::10]:40000\n", "backend/api", netip.MustParseAddrPort("[fd00:10:0:1::10]:40000"), true},
		{"backend/api [::ffff:198.18.1.10]:5\n", "backend/api", netip.MustParseAddrPort("198.18.1.10:5"), true},
		{"garbage", "", netip.AddrPort{}, false},
	}
	for _, tc := range tests {
		name, addr, err := parseReply(tc.line)
		if (err == nil) != tc.ok || name != tc.name || addr != tc.addr {
			t.Errorf("parseReply(%q) = %q, %s, %v", tc.line, name, addr, err)
		}
	}
}

func TestGeneratorValidate(t *testing.T) {
	if _, err := NewGenerator(GeneratorConfig{}); err == nil {
		t.Fatal("want an error without flows")
	}
	if _, err := NewGenerator(GeneratorConfig{Flows: []Flow{{Name: "x", Proto: TCP, To: netip.MustParseAddrPort("127.0.0.1:1")}}}); err == nil {
		t.Fatal("want an error for a flow without netns")
	}
}

func FuzzParseReply(f *testing.F) {
	f.Add("backend/api 198.18.1.10:40000\n")
	f.Add("backend/api [fd00:10:0:1::10]:40000\n")
	f.Fuzz(func(t *testing.T, line string) {
		name, addr, err := parseReply(line)
		if err == nil && (name == "" && addr == netip.AddrPort{}) {
			t.Errorf("parseReply(%q) returned nothing without error", line)
		}
	})
}
