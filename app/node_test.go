package app

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/dualflow/dualflow/internal/reload"
	"github.com/dualflow/dualflow/traceflow/agent"
)

func TestAgentConfig(t *testing.T) {
	dir := t.TempDir()
	tok := filepath.Join(dir, "token")
	os.WriteFile(tok, []byte("s3cret\n"), 0o600)
	cert, key, _, _, _ := writePKI(t, dir)
	t.Setenv(agent.TokenEnv, "")
	for _, tc := range []struct {
		name    string
		cfg     AgentConfig
		wantErr string
	}{
		{"off", AgentConfig{}, ""},
		{"no token", AgentConfig{Addr: "127.0.0.1:9444"}, "needs a token"},
		{"loopback", AgentConfig{Addr: "127.0.0.1:9444", TokenFile: tok}, ""},
		{"loopback v6", AgentConfig{Addr: "[::1]:9444", TokenFile: tok}, ""},
		{"all addresses in clear", AgentConfig{Addr: ":9444", TokenFile: tok}, "not loopback"},
		{"node address in clear", AgentConfig{Addr: "198.18.0.1:9444", TokenFile: tok}, "not loopback"},
		{"TLS", AgentConfig{Addr: ":9444", TokenFile: tok, CertFile: cert, KeyFile: key}, ""},
		{"cert without key", AgentConfig{Addr: ":9444", TokenFile: tok, CertFile: cert}, "go together"},
		{"client CA without TLS", AgentConfig{Addr: "127.0.0.1:9444", TokenFile: tok, ClientCAFile: cert}, "needs --traceflow.tls-cert"},
		{"missing token file", AgentConfig{Addr: "127.0.0.1:9444", TokenFile: filepath.Join(dir, "nope")}, "no such file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.validate(nil)
			if (err == nil) != (tc.wantErr == "") || (err != nil && !strings.Contains(err.Error(), tc.wantErr)) {
				t.Errorf("validate: %v, want %q", err, tc.wantErr)
			}
		})
	}
	t.Setenv(agent.TokenEnv, "from-env")
	c := AgentConfig{Addr: "127.0.0.1:9444"}
	if err := c.validate(nil); err != nil || c.token != "from-env" {
		t.Errorf("token from the environment: %v %q", err, c.token)
	}
}

// idle stands for the node's exporter: it runs until ctx ends.
func idle(ctx context.Context) error {
	<-ctx.Done()
	return nil
}

// startNode runs a node of agent cfg beside an idle exporter until the test
// ends, with the agent on a listener of its own, and returns the agent's
// address and the node's metrics.
func startNode(tb testing.TB, cfg AgentConfig) (addr string, reg *prometheus.Registry) {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	cfg.Listener = ln
	nc := NodeConfig{Agent: cfg}
	nc.Exporter.NodeName = "node-1"
	if err := nc.Agent.validate(nil); err != nil {
		tb.Fatal(err)
	}
	reg = prometheus.NewRegistry()
	n := &Node{cfg: nc, run: idle, reg: reg}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- n.Run(ctx) }()
	tb.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			tb.Error(err)
		}
	})
	return ln.Addr().String(), reg
}

// TestAgentMutualTLS serves the agent of a running node over mutual TLS:
// a controller with the client certificate and the token gets in; without
// the certificate the handshake fails; with a wrong token the agent
// answers 401. The agent's metrics join the exporter's.
func TestAgentMutualTLS(t *testing.T) {
	dir := t.TempDir()
	cert, key, ca, clientCert, clientKey := writePKI(t, dir)
	tok := filepath.Join(dir, "token")
	os.WriteFile(tok, []byte("s3cret\n"), 0o600)
	t.Setenv(agent.TokenEnv, "")
	addr, reg := startNode(t, AgentConfig{TokenFile: tok, CertFile: cert, KeyFile: key, ClientCAFile: ca})
	url := "https://" + addr

	client := func(withCert bool) *http.Client {
		c, k := "", ""
		if withCert {
			c, k = clientCert, clientKey
		}
		files, err := reload.LoadTLS(reload.TLSFiles{CA: ca, Cert: c, Key: k}, reload.Options{})
		if err != nil {
			t.Fatal(err)
		}
		return &http.Client{Transport: &http.Transport{TLSClientConfig: files.ClientConfig("localhost")}, Timeout: 10 * time.Second}
	}
	ctx := context.Background()
	in, err := (&agent.Client{Node: "n1", URL: url, Token: "s3cret", HTTP: client(true)}).Info(ctx)
	if err != nil || in.Node != "node-1" || in.Datapath != "kernel" {
		t.Errorf("mutual TLS with the token: %+v %v", in, err)
	}
	if _, err := (&agent.Client{Node: "n1", URL: url, Token: "wrong", HTTP: client(true)}).Info(ctx); !errors.Is(err, agent.ErrUnauthorized) {
		t.Errorf("wrong token: %v, want unauthorized", err)
	}
	if _, err := (&agent.Client{Node: "n1", URL: url, Token: "s3cret", HTTP: client(false)}).Info(ctx); err == nil || !strings.Contains(err.Error(), "unreachable") {
		t.Errorf("no client certificate: %v, want a failed handshake", err)
	}
	rec := httptest.NewRecorder()
	promhttp.HandlerFor(reg, promhttp.HandlerOpts{}).ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	m := rec.Body.String()
	if !strings.Contains(m, `dualflow_traceflow_agent_requests_total{call="info",result="unauthorized"} 1`) {
		t.Errorf("metrics lack the refused call:\n%s", m)
	}
	// The agent's TLS files are reloaded when they change (package reload).
	if !strings.Contains(m, `dualflow_tls_certificate_expiry_timestamp_seconds{name="traceflow-agent"}`) ||
		!strings.Contains(m, `dualflow_file_reload_errors_total{name="traceflow-agent"} 0`) {
		t.Errorf("metrics lack the agent's TLS files:\n%s", m)
	}
}

// writePKI writes a CA, a server certificate for localhost and 127.0.0.1
// and a client certificate, all signed by the CA.
func writePKI(t *testing.T, dir string) (cert, key, ca, clientCert, clientKey string) {
	t.Helper()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"}, NotBefore: time.Now().Add(-time.Hour),
		NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, _ := x509.ParseCertificate(caDER)
	issue := func(name string, serial int64, usage x509.ExtKeyUsage) (string, string) {
		k, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: name}, NotBefore: time.Now().Add(-time.Hour),
			NotAfter: time.Now().Add(time.Hour), ExtKeyUsage: []x509.ExtKeyUsage{usage}, DNSNames: []string{"localhost"},
			IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, KeyUsage: x509.KeyUsageDigitalSignature}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &k.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		kb, _ := x509.MarshalECPrivateKey(k)
		c, kf := filepath.Join(dir, name+".crt"), filepath.Join(dir, name+".key")
		os.WriteFile(c, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600)
		os.WriteFile(kf, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}), 0o600)
		return c, kf
	}
	ca = filepath.Join(dir, "ca.crt")
	os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), 0o600)
	cert, key = issue("agent", 2, x509.ExtKeyUsageServerAuth)
	clientCert, clientKey = issue("collector", 3, x509.ExtKeyUsageClientAuth)
	return
}

// BenchmarkAgentAtRest reports what a node's traceflow agent holds while
// no trace runs: heap in use and goroutines (a node with the agent, minus
// the same node without it).
func BenchmarkAgentAtRest(b *testing.B) {
	dir := b.TempDir()
	tok := filepath.Join(dir, "token")
	os.WriteFile(tok, []byte("s3cret\n"), 0o600)
	measure := func(agentOn bool) (heap uint64, goroutines int) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		done := make(chan error, 1)
		if agentOn {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				b.Fatal(err)
			}
			cfg := AgentConfig{Listener: ln, TokenFile: tok}
			if err := cfg.validate(nil); err != nil {
				b.Fatal(err)
			}
			n := &Node{cfg: NodeConfig{Agent: cfg}, run: idle, reg: prometheus.NewRegistry()}
			go func() { done <- n.Run(ctx) }()
			// One call, so the server's connection state exists too.
			if _, err := (&agent.Client{Node: "n", URL: "http://" + ln.Addr().String(), Token: "s3cret"}).Info(ctx); err != nil {
				b.Fatal(err)
			}
		} else {
			go func() { done <- idle(ctx) }()
		}
		var ms runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&ms)
		heap, goroutines = ms.HeapInuse, runtime.NumGoroutine()
		cancel()
		<-done
		return heap, goroutines
	}
	var dHeap, dG float64
	for b.Loop() {
		h0, g0 := measure(false)
		h1, g1 := measure(true)
		dHeap += float64(int64(h1) - int64(h0))
		dG += float64(g1 - g0)
	}
	b.ReportMetric(dHeap/float64(b.N)/1024, "KiB-heap")
	b.ReportMetric(dG/float64(b.N), "goroutines")
}
