package reload

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dualflow/dualflow/internal/certs"
	"github.com/dualflow/dualflow/test/support/logtest"
	"github.com/dualflow/dualflow/test/support/reloadtest"
)

// certSet is a CA and its leaf certificates, issued as `dualflow certs`
// does: the collector's names the loopback addresses of both families.
type certSet struct{ dir string }

func newCertSet(t testing.TB) *certSet {
	t.Helper()
	s := &certSet{dir: t.TempDir()}
	s.issue(t, false)
	return s
}

func (s *certSet) issue(t testing.TB, force bool) {
	t.Helper()
	_, err := certs.Issue(certs.Options{Dir: s.dir, Force: force, CollectorDNS: []string{"localhost"},
		CollectorIPs: []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP("::1")}})
	if err != nil {
		t.Fatal(err)
	}
}

// renew issues new leaf certificates under the same CA (`dualflow certs
// --force`, a cert-manager renewal).
func (s *certSet) renew(t testing.TB) { s.issue(t, true) }

func (s *certSet) read(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(s.dir, name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// secret returns a kubernetes.io/tls Secret's keys: the certificate and key
// of a leaf, and the CA.
func (s *certSet) secret(t testing.TB, cert, key string) map[string][]byte {
	return map[string][]byte{"tls.crt": s.read(t, cert), "tls.key": s.read(t, key), "ca.crt": s.read(t, certs.CAFile)}
}

func (s *certSet) serial(t testing.TB, file string) *big.Int {
	t.Helper()
	c, err := tls.X509KeyPair(s.read(t, file), s.read(t, strings.TrimSuffix(file, ".pem")+"-key.pem"))
	if err != nil {
		t.Fatal(err)
	}
	return c.Leaf.SerialNumber
}

func secretFiles(v *reloadtest.Volume) TLSFiles {
	return TLSFiles{Cert: v.Path("tls.crt"), Key: v.Path("tls.key"), CA: v.Path("ca.crt")}
}

// tlsServer accepts TLS connections, completes each handshake and reports
// it: the client certificate's serial, or the error.
type tlsServer struct {
	ln      net.Listener
	results chan handshakeResult
}

type handshakeResult struct {
	client *big.Int
	err    error
}

func newTLSServer(t testing.TB, addr string, cfg *tls.Config) *tlsServer {
	t.Helper()
	ln, err := net.Listen("tcp", net.JoinHostPort(addr, "0"))
	if err != nil {
		t.Fatal(err)
	}
	s := &tlsServer{ln: ln, results: make(chan handshakeResult, 16)}
	done := make(chan struct{})
	t.Cleanup(func() { ln.Close(); <-done })
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			tc := tls.Server(c, cfg)
			tc.SetDeadline(time.Now().Add(30 * time.Second))
			r := handshakeResult{err: tc.Handshake()}
			if r.err == nil {
				if p := tc.ConnectionState().PeerCertificates; len(p) > 0 {
					r.client = p[0].SerialNumber
				}
				tc.Write([]byte{1}) // the client waits for it: the server's verdict is in
			}
			tc.Close()
			s.results <- r
		}
	}()
	return s
}

// handshake dials s with cfg and returns the serial of the server's
// certificate, the client's as the server saw it, and the error of either.
func (s *tlsServer) handshake(t testing.TB, cfg *tls.Config) (server, client *big.Int, err error) {
	t.Helper()
	c, err := net.DialTimeout("tcp", s.ln.Addr().String(), 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	tc := tls.Client(c, cfg)
	tc.SetDeadline(time.Now().Add(30 * time.Second))
	cerr := tc.Handshake()
	if cerr == nil {
		server = tc.ConnectionState().PeerCertificates[0].SerialNumber
		_, cerr = io.ReadFull(tc, make([]byte, 1)) // TLS 1.3: a refused client certificate surfaces here
	}
	tc.Close()
	r := <-s.results
	return server, r.client, errors.Join(cerr, r.err)
}

// echoConn returns a client connection, handshake done, to a server of
// cfg on addr that echoes what it reads until the test ends.
func echoConn(t *testing.T, addr string, server, client *tls.Config) *tls.Conn {
	t.Helper()
	ln, err := tls.Listen("tcp", net.JoinHostPort(addr, "0"), server)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		io.Copy(c, c)
	}()
	c, err := tls.DialWithDialer(&net.Dialer{Timeout: 30 * time.Second}, "tcp", ln.Addr().String(), client)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(); ln.Close(); <-done })
	return c
}

func echo(t *testing.T, c *tls.Conn, msg string) {
	t.Helper()
	c.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := c.Write([]byte(msg)); err != nil {
		t.Fatalf("write %s: %v", msg, err)
	}
	b := make([]byte, len(msg))
	if _, err := io.ReadFull(c, b); err != nil || string(b) != msg {
		t.Fatalf("echo %s: %q %v", msg, b, err)
	}
}

// families are the loopback addresses the TLS tests run over.
var families = []struct{ name, addr string }{{"ipv4", "127.0.0.1"}, {"ipv6", "::1"}}

// TestTLSRotation rotates the files of both ends the way the kubelet
// updates a Secret volume (a new directory, ..data swapped to it), over
// real handshakes in both families: renewed certificates are presented
// at the next handshakes without a restart; a broken update (a key that
// does not match, a certificate half written, a CA file without a
// certificate) leaves the last good files in use, logged and counted
// once; a new CA replaces the old on both ends, and the old CA's
// certificates are refused.
func TestTLSRotation(t *testing.T) {
	for _, fam := range families {
		t.Run(fam.name, func(t *testing.T) {
			var logs logtest.Buffer
			opts := func(name string) Options {
				return Options{Name: name, Logger: logs.Logger(), Interval: 5 * time.Millisecond}
			}
			set := newCertSet(t)
			srvVol := reloadtest.NewVolume(t, 0o640, set.secret(t, certs.CollectorFile, certs.CollectorKeyFile))
			cliVol := reloadtest.NewVolume(t, 0o640, set.secret(t, certs.ExporterFile, certs.ExporterKeyFile))
			srvTLS, err := LoadTLS(secretFiles(srvVol), opts("server"))
			if err != nil {
				t.Fatal(err)
			}
			cliTLS, err := LoadTLS(secretFiles(cliVol), opts("client"))
			if err != nil {
				t.Fatal(err)
			}
			srv := newTLSServer(t, fam.addr, srvTLS.ServerConfig())
			client := cliTLS.ClientConfig(fam.addr) // dialled by address: the address is the name
			want := func(what string, server, client *big.Int) {
				t.Helper()
				waitFor(t, what, func() bool {
					s, c, err := srv.handshake(t, cliTLS.ClientConfig(fam.addr))
					return err == nil && s.Cmp(server) == 0 && c.Cmp(client) == 0
				})
			}
			s1, c1 := set.serial(t, certs.CollectorFile), set.serial(t, certs.ExporterFile)
			if s, c, err := srv.handshake(t, client); err != nil || s.Cmp(s1) != 0 || c.Cmp(c1) != 0 {
				t.Fatalf("first handshake: server %v client %v: %v", s, c, err)
			}

			// A connection established before the rotations goes on after
			// them: an echo over it now and at the end.
			est := echoConn(t, fam.addr, srvTLS.ServerConfig(), client)
			echo(t, est, "before")

			// Renewal under the same CA, the server's then the client's.
			set.renew(t)
			s2, c2 := set.serial(t, certs.CollectorFile), set.serial(t, certs.ExporterFile)
			srvVol.Update(set.secret(t, certs.CollectorFile, certs.CollectorKeyFile))
			want("the renewed server certificate", s2, c1)
			cliVol.Update(set.secret(t, certs.ExporterFile, certs.ExporterKeyFile))
			want("the renewed client certificate", s2, c2)
			if srvTLS.NotAfter().IsZero() || cliTLS.NotAfter().IsZero() {
				t.Error("no NotAfter")
			}

			// Broken updates of the server's Secret: the last good stays.
			good := set.secret(t, certs.CollectorFile, certs.CollectorKeyFile)
			other := newCertSet(t)
			for i, bad := range []struct {
				name  string
				files map[string][]byte
			}{
				{"key of another certificate", map[string][]byte{"tls.crt": good["tls.crt"], "tls.key": other.read(t, certs.CollectorKeyFile), "ca.crt": good["ca.crt"]}},
				{"certificate half written", map[string][]byte{"tls.crt": good["tls.crt"][:len(good["tls.crt"])/2], "tls.key": good["tls.key"], "ca.crt": good["ca.crt"]}},
				{"CA without a certificate", map[string][]byte{"tls.crt": good["tls.crt"], "tls.key": good["tls.key"], "ca.crt": []byte("not a certificate\n")}},
				{"certificate missing", map[string][]byte{"tls.key": good["tls.key"], "ca.crt": good["ca.crt"]}},
			} {
				srvVol.Update(bad.files)
				waitFor(t, bad.name+" counted", func() bool { srvTLS.f.Get(); return srvTLS.f.errors.Load() == uint64(i+1) })
				for range 3 {
					if s, c, err := srv.handshake(t, client); err != nil || s.Cmp(s2) != 0 || c.Cmp(c2) != 0 {
						t.Fatalf("%s: server %v client %v: %v, want the last good", bad.name, s, c, err)
					}
				}
			}
			if n := len(logs.Lines("reloading changed files failed")); n != 4 {
				t.Errorf("4 broken updates logged %d times, want once each:\n%s", n, logs.String())
			}

			// The server's Secret back to good: loaded (same content, new files).
			srvVol.Update(good)
			waitFor(t, "the good files reloaded", func() bool { srvTLS.f.Get(); return srvTLS.f.reloads.Load() == 2 })

			// A new CA on both ends (each end's Secret updated in turn;
			// handshakes fail in between, as they would in a cluster).
			newCA := newCertSet(t)
			srvVol.Update(newCA.secret(t, certs.CollectorFile, certs.CollectorKeyFile))
			cliVol.Update(newCA.secret(t, certs.ExporterFile, certs.ExporterKeyFile))
			want("the new CA's certificates", newCA.serial(t, certs.CollectorFile), newCA.serial(t, certs.ExporterFile))
			// The server refuses a client certificate of the old CA (the
			// client trusting the new one, so that the refusal is the
			// server's), and a client trusting only the old CA refuses
			// the server.
			oldCert := set.secret(t, certs.ExporterFile, certs.ExporterKeyFile)
			oldCert["ca.crt"] = newCA.read(t, certs.CAFile)
			old, err := LoadTLS(secretFiles(reloadtest.NewVolume(t, 0o640, oldCert)), Options{})
			if err != nil {
				t.Fatal(err)
			}
			if _, _, err := srv.handshake(t, old.ClientConfig(fam.addr)); err == nil || !strings.Contains(err.Error(), "certificate") {
				t.Errorf("the server accepted a client certificate of the old CA: %v", err)
			}
			oldCA, err := LoadTLS(secretFiles(reloadtest.NewVolume(t, 0o640, set.secret(t, certs.ExporterFile, certs.ExporterKeyFile))), Options{})
			if err != nil {
				t.Fatal(err)
			}
			if _, _, err := srv.handshake(t, oldCA.ClientConfig(fam.addr)); err == nil {
				t.Error("a client trusting only the old CA accepted the server")
			}

			// The connection of before every rotation still carries data.
			echo(t, est, "after")
		})
	}
}

// TestTLSVerify: the verification TLS does itself (to follow the CA
// file) refuses what crypto/tls would: another CA's certificate, a name
// the certificate does not hold, a client certificate that is not for
// clients, no client certificate; and a server dialled by address
// without a name, which it cannot check.
func TestTLSVerify(t *testing.T) {
	set, other := newCertSet(t), newCertSet(t)
	load := func(s *certSet, cert, key string) *TLS {
		v := reloadtest.NewVolume(t, 0o600, s.secret(t, cert, key))
		tl, err := LoadTLS(secretFiles(v), Options{})
		if err != nil {
			t.Fatal(err)
		}
		return tl
	}
	srvTLS := load(set, certs.CollectorFile, certs.CollectorKeyFile)
	client := load(set, certs.ExporterFile, certs.ExporterKeyFile)
	for _, fam := range families {
		t.Run(fam.name, func(t *testing.T) {
			srv := newTLSServer(t, fam.addr, srvTLS.ServerConfig())
			sni := client.ClientConfig("").Clone()
			sni.ServerName = "localhost" // what tls.Dial and http.Transport do with a DNS host
			for _, tc := range []struct {
				name string
				cfg  *tls.Config
				ok   bool
			}{
				{"by address", client.ClientConfig(fam.addr), true},
				{"by DNS name", client.ClientConfig("dualflow-collector.dualflow.svc"), true},
				{"by the DNS name dialled (SNI)", sni, true},
				{"a name the certificate does not hold", client.ClientConfig("other.dualflow.svc"), false},
				{"by address without a name", client.ClientConfig(""), false},
				{"a server of another CA", load(other, certs.ExporterFile, certs.ExporterKeyFile).ClientConfig(fam.addr), false},
				{"a client certificate of another CA", func() *tls.Config {
					c := load(other, certs.ExporterFile, certs.ExporterKeyFile)
					cfg := c.ClientConfig(fam.addr)
					cfg.VerifyConnection, cfg.InsecureSkipVerify = client.ClientConfig(fam.addr).VerifyConnection, true
					return cfg
				}(), false},
				{"a server certificate as a client's", func() *tls.Config {
					c := load(set, certs.CollectorFile, certs.CollectorKeyFile)
					return c.ClientConfig(fam.addr)
				}(), false},
				{"no client certificate", func() *tls.Config {
					v := reloadtest.NewVolume(t, 0o600, map[string][]byte{"ca.crt": set.read(t, certs.CAFile)})
					c, err := LoadTLS(TLSFiles{CA: v.Path("ca.crt")}, Options{})
					if err != nil {
						t.Fatal(err)
					}
					return c.ClientConfig(fam.addr)
				}(), false},
			} {
				_, _, err := srv.handshake(t, tc.cfg)
				if tc.ok != (err == nil) {
					t.Errorf("%s: %v", tc.name, err)
				}
				if tc.name == "by address without a name" && !errors.Is(err, ErrNoServerName) {
					t.Errorf("%s: %v, want ErrNoServerName", tc.name, err)
				}
			}
		})
	}
	if _, err := LoadTLS(TLSFiles{Cert: "x.pem"}, Options{}); err == nil {
		t.Error("a certificate without its key")
	}
	if _, err := LoadTLS(TLSFiles{}, Options{}); err == nil {
		t.Error("no files")
	}
}

// BenchmarkGet is what a File costs each use between checks (each TLS
// handshake, each request with a token).
func BenchmarkGet(b *testing.B) {
	path := filepath.Join(b.TempDir(), "value")
	os.WriteFile(path, []byte("one"), 0o600)
	f, err := NewFile(Options{Interval: time.Hour}, loadText(path), path)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		f.Get()
	}
}

// BenchmarkCheck is a check of unchanged TLS files (three stats), which a
// File does at most once per interval (a second by default).
func BenchmarkCheck(b *testing.B) {
	set := newCertSet(b)
	v := reloadtest.NewVolume(b, 0o600, set.secret(b, certs.CollectorFile, certs.CollectorKeyFile))
	tl, err := LoadTLS(secretFiles(v), Options{})
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		tl.f.mu.Lock()
		tl.f.check()
		tl.f.mu.Unlock()
	}
}

// BenchmarkHandshake compares a full mutual-TLS handshake over loopback
// with the static configuration crypto/tls builds from files read once,
// and with the reloading one (the difference is the per-handshake cost
// of reloading).
func BenchmarkHandshake(b *testing.B) {
	set := newCertSet(b)
	srvVol := reloadtest.NewVolume(b, 0o600, set.secret(b, certs.CollectorFile, certs.CollectorKeyFile))
	cliVol := reloadtest.NewVolume(b, 0o600, set.secret(b, certs.ExporterFile, certs.ExporterKeyFile))
	srvTLS, _ := LoadTLS(secretFiles(srvVol), Options{})
	cliTLS, _ := LoadTLS(secretFiles(cliVol), Options{})
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(set.read(b, certs.CAFile))
	srvCert, _ := tls.X509KeyPair(set.read(b, certs.CollectorFile), set.read(b, certs.CollectorKeyFile))
	cliCert, _ := tls.X509KeyPair(set.read(b, certs.ExporterFile), set.read(b, certs.ExporterKeyFile))
	for _, bc := range []struct {
		name           string
		server, client *tls.Config
	}{
		{"static", &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{srvCert}, ClientCAs: pool, ClientAuth: tls.RequireAndVerifyClientCert},
			&tls.Config{MinVersion: tls.VersionTLS12, RootCAs: pool, ServerName: "127.0.0.1", Certificates: []tls.Certificate{cliCert}}},
		{"reload", srvTLS.ServerConfig(), cliTLS.ClientConfig("127.0.0.1")},
	} {
		b.Run(bc.name, func(b *testing.B) {
			srv := newTLSServer(b, "127.0.0.1", bc.server)
			b.ReportAllocs()
			for b.Loop() {
				if _, _, err := srv.handshake(b, bc.client); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
