package agent

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dualflow/dualflow/internal/certs"
	"github.com/dualflow/dualflow/internal/reload"
	"github.com/dualflow/dualflow/test/support/reloadtest"
)

// TestDirectoryTLSReload: the controller's client certificate, mounted
// from a Secret, is renewed under the running collector (the kubelet's
// swap of ..data) and the agents see the new one on the next connections;
// in both families, with the agents verified for a shared name
// (--traceflow.server-name) and for the node address dialled (no server
// name: per-node certificates), over HTTP/2 as before.
func TestDirectoryTLSReload(t *testing.T) {
	dir := t.TempDir()
	issue := func(force bool) {
		t.Helper()
		// The collector's certificate stands for a per-node agent's: it
		// holds the loopback addresses of both families.
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
	serial := func(cert, key string) *big.Int {
		c, err := tls.X509KeyPair(read(cert), read(key))
		if err != nil {
			t.Fatal(err)
		}
		return c.Leaf.SerialNumber
	}
	controllerSecret := func() map[string][]byte {
		return map[string][]byte{"tls.crt": read(certs.ControllerFile), "tls.key": read(certs.ControllerKeyFile), "ca.crt": read(certs.CAFile)}
	}
	issue(false)
	ctlVol := reloadtest.NewVolume(t, 0o640, controllerSecret())
	t.Setenv(TokenEnv, "s3cret")

	for _, fam := range []struct{ name, addr string }{{"ipv4", "127.0.0.1"}, {"ipv6", "::1"}} {
		for _, mode := range []struct {
			name, serverName, cert, key string
		}{
			{"shared name", certs.DefaultAgentName, certs.AgentFile, certs.AgentKeyFile},
			{"node address", "", certs.CollectorFile, certs.CollectorKeyFile},
		} {
			t.Run(fam.name+"/"+mode.name, func(t *testing.T) {
				agentVol := reloadtest.NewVolume(t, 0o640, map[string][]byte{"tls.crt": read(mode.cert), "tls.key": read(mode.key), "ca.crt": read(certs.CAFile)})
				agentTLS, err := reload.LoadTLS(reload.TLSFiles{Cert: agentVol.Path("tls.crt"), Key: agentVol.Path("tls.key"), CA: agentVol.Path("ca.crt")}, reload.Options{})
				if err != nil {
					t.Fatal(err)
				}
				// The agent as the exporter serves it (http.Server.ServeTLS),
				// reporting the client certificate and protocol of each call.
				var mu sync.Mutex
				var lastClient *big.Int
				var lastProto int
				srv := &http.Server{TLSConfig: agentTLS.ServerConfig(), Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					mu.Lock()
					lastClient, lastProto = r.TLS.PeerCertificates[0].SerialNumber, r.ProtoMajor
					mu.Unlock()
					json.NewEncoder(w).Encode(Info{Node: "n1", Datapath: "kernel"})
				})}
				ln, err := net.Listen("tcp", net.JoinHostPort(fam.addr, "0"))
				if err != nil {
					t.Fatal(err)
				}
				go srv.ServeTLS(ln, "", "")
				t.Cleanup(func() { srv.Close() })

				d, err := NewDirectory(DirectoryConfig{Static: map[string]string{"n1": "https://" + ln.Addr().String()},
					CAFile: ctlVol.Path("ca.crt"), CertFile: ctlVol.Path("tls.crt"), KeyFile: ctlVol.Path("tls.key"), ServerName: mode.serverName}, nil)
				if err != nil {
					t.Fatal(err)
				}
				info := func() (*big.Int, int, error) {
					c, err := d.Agent("n1")
					if err != nil {
						t.Fatal(err)
					}
					d.http.CloseIdleConnections() // a new connection, a new handshake
					if _, err := c.Info(context.Background()); err != nil {
						return nil, 0, err
					}
					mu.Lock()
					defer mu.Unlock()
					return lastClient, lastProto, nil
				}
				before := serial(certs.ControllerFile, certs.ControllerKeyFile)
				got, proto, err := info()
				if err != nil || got.Cmp(before) != 0 || proto != 2 {
					t.Fatalf("before: client %v, HTTP/%d, %v; want %v over HTTP/2", got, proto, err, before)
				}
				issue(true)
				after := serial(certs.ControllerFile, certs.ControllerKeyFile)
				ctlVol.Update(controllerSecret())
				deadline := time.Now().Add(30 * time.Second) // checked once a second
				for {
					got, _, err := info()
					if err != nil {
						t.Fatal(err)
					}
					if got.Cmp(after) == 0 {
						break
					}
					if time.Now().After(deadline) {
						t.Fatal("the agent never saw the renewed client certificate")
					}
					time.Sleep(20 * time.Millisecond)
				}
			})
		}
	}

	// Without a server name, an agent whose certificate does not hold the
	// address dialled is refused.
	agentVol := reloadtest.NewVolume(t, 0o640, map[string][]byte{"tls.crt": read(certs.AgentFile), "tls.key": read(certs.AgentKeyFile), "ca.crt": read(certs.CAFile)})
	agentTLS, err := reload.LoadTLS(reload.TLSFiles{Cert: agentVol.Path("tls.crt"), Key: agentVol.Path("tls.key"), CA: agentVol.Path("ca.crt")}, reload.Options{})
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{TLSConfig: agentTLS.ServerConfig(), Handler: http.NotFoundHandler()}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.ServeTLS(ln, "", "")
	defer srv.Close()
	d, err := NewDirectory(DirectoryConfig{Static: map[string]string{"n1": "https://" + ln.Addr().String()},
		CAFile: ctlVol.Path("ca.crt"), CertFile: ctlVol.Path("tls.crt"), KeyFile: ctlVol.Path("tls.key")}, nil)
	if err != nil {
		t.Fatal(err)
	}
	c, _ := d.Agent("n1")
	if _, err := c.Info(context.Background()); err == nil || !strings.Contains(err.Error(), "127.0.0.1") || !strings.Contains(err.Error(), "certificate") {
		t.Errorf("an agent certificate without the address dialled: %v, want refused", err)
	}
}
