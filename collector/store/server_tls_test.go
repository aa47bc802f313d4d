package store

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/dualflow/dualflow/internal/certs"
	"github.com/dualflow/dualflow/test/support/reloadtest"
)

// TestServerTLSReload: the ClickHouse client certificate, mounted from a
// Secret, is renewed under the running collector (the kubelet's swap of
// ..data): the connections made after present the new one; in both
// families, the server verified for the address of the DSN.
func TestServerTLSReload(t *testing.T) {
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
	// The collector's client certificate for the agents stands for the
	// one ClickHouse would take: a client certificate of the same CA.
	secret := func() map[string][]byte {
		return map[string][]byte{"tls.crt": read(certs.ControllerFile), "tls.key": read(certs.ControllerKeyFile), "ca.crt": read(certs.CAFile)}
	}
	serial := func() *big.Int {
		c, err := tls.X509KeyPair(read(certs.ControllerFile), read(certs.ControllerKeyFile))
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
			var mu sync.Mutex
			var last *big.Int
			srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				mu.Lock()
				last = r.TLS.PeerCertificates[0].SerialNumber
				mu.Unlock()
				io.WriteString(w, "{}\n")
			}))
			ln, err := net.Listen("tcp", net.JoinHostPort(fam.addr, "0"))
			if err != nil {
				t.Fatal(err)
			}
			srv.Listener.Close()
			srv.Listener = ln
			srv.TLS = &tls.Config{Certificates: []tls.Certificate{server}, ClientCAs: pool, ClientAuth: tls.RequireAndVerifyClientCert}
			srv.StartTLS()
			defer srv.Close()
			s, err := NewServer(ServerConfig{DSN: "https://" + ln.Addr().String() + "/?secure=true",
				CAFile: vol.Path("ca.crt"), CertFile: vol.Path("tls.crt"), KeyFile: vol.Path("tls.key")})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			query := func() *big.Int {
				t.Helper()
				s.http.client.CloseIdleConnections() // a new connection, a new handshake
				if _, err := s.Query(context.Background(), "SELECT 1", "JSONEachRow"); err != nil {
					t.Fatal(err)
				}
				mu.Lock()
				defer mu.Unlock()
				return last
			}
			if got, want := query(), serial(); got.Cmp(want) != 0 {
				t.Fatalf("client certificate %v, want %v", got, want)
			}
			issue(true)
			vol.Update(secret())
			deadline := time.Now().Add(30 * time.Second) // the files are checked once a second
			for query().Cmp(serial()) != 0 {
				if time.Now().After(deadline) {
					t.Fatal("the server never saw the renewed client certificate")
				}
				time.Sleep(20 * time.Millisecond)
			}
			reg := prometheus.NewRegistry()
			reg.MustRegister(s.Metrics())
			want := `
# HELP dualflow_file_reloads_total Changed certificate, key, CA or token files loaded without a restart, by name (ipfix-server, web-tokens, …).
# TYPE dualflow_file_reloads_total counter
dualflow_file_reloads_total{name="clickhouse-client"} 1
`
			if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "dualflow_file_reloads_total"); err != nil {
				t.Error(err)
			}
		})
	}
}

// TestServerTLSName: the name the server's certificate is checked for,
// which the reloaded CA's check must know: tls_server_name, else the one
// host, else the DNS name dialled; several hosts given by address, with a
// CA file and no tls_server_name, are refused at start, saying what to do.
func TestServerTLSName(t *testing.T) {
	dir := t.TempDir()
	if _, err := certs.Issue(certs.Options{Dir: dir}); err != nil {
		t.Fatal(err)
	}
	ca := filepath.Join(dir, certs.CAFile)
	for _, tc := range []struct {
		dsn, name string
		ok        bool
	}{
		{"clickhouse://198.18.0.5:9440/?secure=true", "198.18.0.5", true},
		{"clickhouse://[fd00:10::5]:9440/?secure=true", "fd00:10::5", true},
		{"https://ch.example.test:8443/?secure=true", "ch.example.test", true},
		{"clickhouse://ch-1.example.test:9440,ch-2.example.test:9440/?secure=true", "", true},
		{"clickhouse://198.18.0.5:9440,198.18.0.6:9440/?secure=true&tls_server_name=ch.example.test", "ch.example.test", true},
		{"clickhouse://198.18.0.5:9440,198.18.0.6:9440/?secure=true", "", false},
		{"clickhouse://[fd00:10::5]:9440,[fd00:10::6]:9440/?secure=true", "", false},
		{"clickhouse://198.18.0.5:9440,198.18.0.6:9440/?secure=true&skip_verify=true", "", true},
	} {
		opt, err := clickhouse.ParseDSN(tc.dsn)
		if err != nil {
			t.Fatal(err)
		}
		skip := opt.TLS.InsecureSkipVerify
		files, err := clickhouseTLS(ServerConfig{DSN: tc.dsn, CAFile: ca}, opt)
		if tc.ok != (err == nil) {
			t.Errorf("%s: %v", tc.dsn, err)
			continue
		}
		if err != nil {
			if !strings.Contains(err.Error(), "tls_server_name") {
				t.Errorf("%s: the error does not say what to do: %v", tc.dsn, err)
			}
			continue
		}
		if files == nil || opt.TLS.ServerName != tc.name || skip != (opt.TLS.VerifyConnection == nil) || !opt.TLS.InsecureSkipVerify {
			t.Errorf("%s: name %q, verified by the CA file %v (skip_verify %v)", tc.dsn, opt.TLS.ServerName, opt.TLS.VerifyConnection != nil, skip)
		}
	}
}
