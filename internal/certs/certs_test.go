package certs

import (
	"crypto/tls"
	"crypto/x509"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dualflow/dualflow/internal/reload"
)

func pool(t *testing.T, dir string) *x509.CertPool {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, CAFile))
	if err != nil {
		t.Fatal(err)
	}
	p := x509.NewCertPool()
	if !p.AppendCertsFromPEM(b) {
		t.Fatal("no CA in ca.pem")
	}
	return p
}

func pair(t *testing.T, dir, cert, key string) tls.Certificate {
	t.Helper()
	c, err := tls.LoadX509KeyPair(filepath.Join(dir, cert), filepath.Join(dir, key))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// handshake runs one TLS handshake over loopback and returns the client's
// and the server's errors.
func handshake(t *testing.T, server, client *tls.Config) (error, error) {
	t.Helper()
	ln, err := tls.Listen("tcp", "127.0.0.1:0", server)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	srvErr := make(chan error, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			srvErr <- err
			return
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(30 * time.Second))
		srvErr <- c.(*tls.Conn).Handshake()
	}()
	c, err := tls.DialWithDialer(&net.Dialer{Timeout: 30 * time.Second}, "tcp", ln.Addr().String(), client)
	if err == nil {
		// TLS 1.3 reports a refused client certificate on the first read.
		c.SetDeadline(time.Now().Add(30 * time.Second))
		_, err = c.Read(make([]byte, 1))
		if err != nil && strings.Contains(err.Error(), "EOF") {
			err = nil
		}
		c.Close()
	}
	return err, <-srvErr
}

func TestIssueAndHandshake(t *testing.T) {
	dir := t.TempDir()
	out, err := Issue(Options{Dir: dir, CollectorDNS: []string{"flows.example.test"}, CollectorIPs: []net.IP{net.ParseIP("fd00:10::99")}})
	if err != nil {
		t.Fatal(err)
	}
	if len(out.Files) != 10 || out.CAReused {
		t.Fatalf("issued %v (CA reused %v)", out.Files, out.CAReused)
	}
	for _, f := range []string{CAKeyFile, CollectorKeyFile, ExporterKeyFile, AgentKeyFile, ControllerKeyFile} {
		if st, err := os.Stat(filepath.Join(dir, f)); err != nil || st.Mode().Perm() != 0o600 {
			t.Errorf("%s: %v %v, want mode 0600", f, st.Mode(), err)
		}
	}
	ca := pool(t, dir)

	// IPFIX over TLS: the collector's listener requires the exporters'
	// client certificate; exporters verify the collector by its Service name.
	collector := &tls.Config{Certificates: []tls.Certificate{pair(t, dir, CollectorFile, CollectorKeyFile)},
		ClientCAs: ca, ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS12}
	exporter := func(name string, withCert bool) *tls.Config {
		c := &tls.Config{RootCAs: ca, ServerName: name, MinVersion: tls.VersionTLS12}
		if withCert {
			c.Certificates = []tls.Certificate{pair(t, dir, ExporterFile, ExporterKeyFile)}
		}
		return c
	}
	for _, name := range []string{"dualflow-collector", "dualflow-collector.dualflow.svc", "dualflow-collector.dualflow.svc.cluster.local", "flows.example.test", "fd00:10::99"} {
		if cerr, serr := handshake(t, collector, exporter(name, true)); cerr != nil || serr != nil {
			t.Errorf("exporter → collector as %s: client %v, server %v", name, cerr, serr)
		}
	}
	if cerr, _ := handshake(t, collector, exporter("other.dualflow.svc", true)); cerr == nil {
		t.Error("the collector's certificate verified for a name it does not hold")
	}
	if _, serr := handshake(t, collector, exporter("dualflow-collector", false)); serr == nil {
		t.Error("the collector accepted an exporter without a client certificate")
	}

	// Traceflow: the product's own TLS configurations, agents verified for
	// their shared name, the collector's client certificate required.
	load := func(cert, key string) *reload.TLS {
		t.Helper()
		files := reload.TLSFiles{CA: filepath.Join(dir, CAFile)}
		if cert != "" {
			files.Cert, files.Key = filepath.Join(dir, cert), filepath.Join(dir, key)
		}
		tl, err := reload.LoadTLS(files, reload.Options{})
		if err != nil {
			t.Fatal(err)
		}
		return tl
	}
	agentTLS := load(AgentFile, AgentKeyFile).ServerConfig()
	ctl := load(ControllerFile, ControllerKeyFile)
	if cerr, serr := handshake(t, agentTLS, ctl.ClientConfig(DefaultAgentName)); cerr != nil || serr != nil {
		t.Errorf("collector → agent: client %v, server %v", cerr, serr)
	}
	// What the dialled node address would be without --traceflow.server-name.
	if cerr, _ := handshake(t, agentTLS, ctl.ClientConfig("198.18.0.10")); cerr == nil {
		t.Error("the agents' certificate verified for a node address")
	}
	// The exporter's certificate is for clients only: it cannot serve.
	fake := &tls.Config{Certificates: []tls.Certificate{pair(t, dir, ExporterFile, ExporterKeyFile)}, MinVersion: tls.VersionTLS12}
	if cerr, _ := handshake(t, fake, exporter(DefaultAgentName, true)); cerr == nil {
		t.Error("a client certificate was accepted as a server's")
	}
}

func TestRenewUnderSameCA(t *testing.T) {
	dir := t.TempDir()
	if _, err := Issue(Options{Dir: dir}); err != nil {
		t.Fatal(err)
	}
	ca1, _ := os.ReadFile(filepath.Join(dir, CAFile))
	col1, _ := os.ReadFile(filepath.Join(dir, CollectorFile))
	if _, err := Issue(Options{Dir: dir}); err == nil || !strings.Contains(err.Error(), "--force") {
		t.Fatalf("second issue without --force: %v", err)
	}
	out, err := Issue(Options{Dir: dir, Force: true})
	if err != nil || !out.CAReused {
		t.Fatalf("renewal: %v (CA reused %v)", err, out != nil && out.CAReused)
	}
	ca2, _ := os.ReadFile(filepath.Join(dir, CAFile))
	col2, _ := os.ReadFile(filepath.Join(dir, CollectorFile))
	if string(ca1) != string(ca2) || string(col1) == string(col2) {
		t.Error("renewal must keep the CA and replace the leaf certificates")
	}
	// A CA that would expire before the new certificates is refused.
	if _, err := Issue(Options{Dir: dir, Force: true, Validity: 20 * 365 * 24 * time.Hour}); err == nil {
		t.Error("issued certificates outliving their CA")
	}
	// Half a CA is an error, not a silent new CA.
	os.Remove(filepath.Join(dir, CAKeyFile))
	if _, err := Issue(Options{Dir: dir, Force: true}); err == nil {
		t.Error("issued with ca.pem but no ca-key.pem")
	}
}
