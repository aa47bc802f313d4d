package ipfix

import (
	"crypto/tls"
	"crypto/x509"
	"io"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/dualflow/dualflow/internal/certs"
	"github.com/dualflow/dualflow/test/support/reloadtest"
)

// TestTLSReload: the exporter's client certificate and CA, mounted from a
// Secret, are renewed under the running exporter (the kubelet's swap of
// ..data): the connections it makes after present the new certificate;
// in both families, the collector verified for the address dialled.
func TestTLSReload(t *testing.T) {
	dir := t.TempDir()
	issue := func(force bool) {
		t.Helper()
		if _, err := certs.Issue(certs.Options{Dir: dir, Force: force, CollectorIPs: []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP("::1")}}); err != nil {
			t.Fatal(err)
		}
	}
	read := func(name string) []byte {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	secret := func() map[string][]byte {
		return map[string][]byte{"tls.crt": read(certs.ExporterFile), "tls.key": read(certs.ExporterKeyFile), "ca.crt": read(certs.CAFile)}
	}
	serial := func() *big.Int {
		c, err := tls.X509KeyPair(read(certs.ExporterFile), read(certs.ExporterKeyFile))
		if err != nil {
			t.Fatal(err)
		}
		return c.Leaf.SerialNumber
	}
	issue(false)
	vol := reloadtest.NewVolume(t, 0o640, secret())
	server, err := tls.X509KeyPair(read(certs.CollectorFile), read(certs.CollectorKeyFile))
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(read(certs.CAFile))

	for _, fam := range []struct{ name, addr string }{{"ipv4", "127.0.0.1"}, {"ipv6", "::1"}} {
		t.Run(fam.name, func(t *testing.T) {
			// A collector that reports each session's client certificate,
			// reads a message and hangs up, so that the exporter dials again.
			ln, err := tls.Listen("tcp", net.JoinHostPort(fam.addr, "0"), &tls.Config{Certificates: []tls.Certificate{server},
				ClientCAs: pool, ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS12})
			if err != nil {
				t.Fatal(err)
			}
			clients := make(chan *big.Int, 64)
			go func() {
				for {
					c, err := ln.Accept()
					if err != nil {
						return
					}
					tc := c.(*tls.Conn)
					tc.SetDeadline(time.Now().Add(30 * time.Second))
					if tc.Handshake() == nil {
						io.ReadFull(tc, make([]byte, 16))
						select {
						case clients <- tc.ConnectionState().PeerCertificates[0].SerialNumber:
						default:
						}
					}
					tc.Close()
				}
			}()
			t.Cleanup(func() { ln.Close() })
			e := newExporter(t, Config{Address: ln.Addr().String(), Transport: TLS,
				CAFile: vol.Path("ca.crt"), CertFile: vol.Path("tls.crt"), KeyFile: vol.Path("tls.key"),
				FlushInterval: 10 * time.Millisecond, BackoffMin: 10 * time.Millisecond, BackoffMax: 50 * time.Millisecond})
			start(t, e)
			// waitSerial sends until a session presents want.
			waitSerial := func(what string, want *big.Int) {
				t.Helper()
				deadline := time.After(30 * time.Second) // the files are checked once a second
				for {
					e.Export(records(4, 1, 0))
					select {
					case got := <-clients:
						if got.Cmp(want) == 0 {
							return
						}
					case <-time.After(20 * time.Millisecond):
					case <-deadline:
						t.Fatalf("no session with the %s client certificate", what)
					}
				}
			}
			waitSerial("first", serial())
			issue(true)
			vol.Update(secret())
			waitSerial("renewed", serial())
		})
	}
}
