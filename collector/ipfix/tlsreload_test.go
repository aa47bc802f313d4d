package ipfix

import (
	"crypto/tls"
	"crypto/x509"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/dualflow/dualflow/flow"
	"github.com/dualflow/dualflow/internal/certs"
	"github.com/dualflow/dualflow/test/support/reloadtest"
)

// TestTLSReload: the TLS listeners of both families follow their Secret
// volume: when cert-manager (here `dualflow certs --force`) renews the
// certificate and the kubelet swaps the files, the next sessions get the
// new certificate, without a restart, and deliver records; the reload is
// counted.
func TestTLSReload(t *testing.T) {
	dir := t.TempDir()
	issue := func(force bool) {
		t.Helper()
		if _, err := certs.Issue(certs.Options{Dir: dir, Force: force, CollectorIPs: []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP("::1")}}); err != nil {
			t.Fatal(err)
		}
	}
	read := func(name string) []byte {
		t.Helper()
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	secret := func() map[string][]byte {
		return map[string][]byte{"tls.crt": read(certs.CollectorFile), "tls.key": read(certs.CollectorKeyFile), "ca.crt": read(certs.CAFile)}
	}
	serial := func() *big.Int {
		c, err := tls.X509KeyPair(read(certs.CollectorFile), read(certs.CollectorKeyFile))
		if err != nil {
			t.Fatal(err)
		}
		return c.Leaf.SerialNumber
	}
	issue(false)
	vol := reloadtest.NewVolume(t, 0o640, secret())
	l, q, reg := startListener(t, Config{TLSAddrs: []string{"127.0.0.1:0", "[::1]:0"},
		TLSCertFile: vol.Path("tls.crt"), TLSKeyFile: vol.Path("tls.key"), TLSClientCAFile: vol.Path("ca.crt")})
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(read(certs.CAFile))
	client, err := tls.X509KeyPair(read(certs.ExporterFile), read(certs.ExporterKeyFile))
	if err != nil {
		t.Fatal(err)
	}
	// session dials addr, sends a record of family v and returns the
	// serial of the certificate the listener presented.
	session := func(addr net.Addr, v uint8) *big.Int {
		t.Helper()
		c, err := tls.DialWithDialer(&net.Dialer{Timeout: 30 * time.Second}, "tcp", addr.String(),
			&tls.Config{RootCAs: roots, Certificates: []tls.Certificate{client}, MinVersion: tls.VersionTLS12})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		recs := sampleRecords()
		for i := range recs {
			if flow.Version(recs[i].SrcAddr) == v {
				if _, err := c.Write(encoderMessage(mustEncoder(v, 256+uint16(v)), 1, 0, true, &recs[i])); err != nil {
					t.Fatal(err)
				}
				collect(t, q, 1)
				break
			}
		}
		return c.ConnectionState().PeerCertificates[0].SerialNumber
	}
	addrs := l.TLSAddrs()
	first := serial()
	for i, a := range addrs {
		if got := session(a, uint8(4+2*i)); got.Cmp(first) != 0 {
			t.Fatalf("%s: serial %v, want %v", a, got, first)
		}
	}
	issue(true)
	renewed := serial()
	vol.Update(secret())
	for i, a := range addrs {
		deadline := time.Now().Add(30 * time.Second) // checked once a second
		for session(a, uint8(4+2*i)).Cmp(renewed) != 0 {
			if time.Now().After(deadline) {
				t.Fatalf("%s: still the old certificate", a)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	want := `
# HELP dualflow_file_reloads_total Changed certificate, key, CA or token files loaded without a restart, by name (ipfix-server, web-tokens, …).
# TYPE dualflow_file_reloads_total counter
dualflow_file_reloads_total{name="ipfix-server"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "dualflow_file_reloads_total"); err != nil {
		t.Error(err)
	}
}
