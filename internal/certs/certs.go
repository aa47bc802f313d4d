// Package certs issues the TLS certificates of a dualflow deployment from a
// private CA: the collector's IPFIX TLS listener, the exporters' client
// certificate (mutual TLS), the node agents' traceflow certificate and the
// collector's client certificate for the agents. `dualflow certs` writes
// them as PEM files for clusters without cert-manager.
//
// Node agents are reached at each node's address, so their one shared
// certificate cannot name them all: it names AgentName, and the collector
// verifies the agents against the private CA for that name
// (--traceflow.server-name). A private CA that issues only dualflow's
// certificates makes the fixed name as strong as an address.
package certs

import (
	"cmp"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/dualflow/dualflow/internal/atomicfile"
	"github.com/dualflow/dualflow/internal/defaults"
)

// Options say what to issue.
type Options struct {
	// Dir receives the files. An existing ca.pem and ca-key.pem there are
	// reused (leaf certificates are renewed under the same CA).
	Dir string
	// Namespace and CollectorService name the collector's Service: its
	// certificate holds <svc>, <svc>.<ns>, <svc>.<ns>.svc and
	// <svc>.<ns>.svc.<ClusterDomain>.
	Namespace, CollectorService, ClusterDomain string
	// CollectorDNS and CollectorIPs are extra names and addresses of the
	// collector (a LoadBalancer's, for exporters outside the cluster).
	CollectorDNS []string
	CollectorIPs []net.IP
	// AgentName is the name in the node agents' certificate.
	AgentName string
	// Validity of the leaf certificates; the CA lives 10 times longer.
	Validity time.Duration
	// Force overwrites existing leaf files.
	Force bool
	// Now is the issue time (zero: time.Now()).
	Now time.Time
}

// Defaults of Options.
const (
	DefaultNamespace        = "dualflow"
	DefaultCollectorService = "dualflow-collector"
	DefaultClusterDomain    = "cluster.local"
	DefaultAgentName        = "dualflow-agent"
	DefaultValidity         = 365 * 24 * time.Hour
)

// Files of a set, relative to Options.Dir. Keys are written 0600.
const (
	CAFile             = "ca.pem"
	CAKeyFile          = "ca-key.pem"
	CollectorFile      = "collector.pem"
	CollectorKeyFile   = "collector-key.pem"
	ExporterFile       = "exporter.pem"
	ExporterKeyFile    = "exporter-key.pem"
	AgentFile          = "agent.pem"
	AgentKeyFile       = "agent-key.pem"
	ControllerFile     = "controller.pem"
	ControllerKeyFile  = "controller-key.pem"
	caCommonName       = "dualflow CA"
	exporterCommonName = "dualflow-exporter"
	controllerCN       = "dualflow-collector-traceflow"
)

// Issued lists the files written.
type Issued struct {
	Files    []string
	CAReused bool
}

// Issue writes the CA (unless it exists) and the four leaf certificates.
func Issue(o Options) (*Issued, error) {
	o.setDefaults()
	if o.Dir == "" {
		return nil, errors.New("certs: no output directory")
	}
	if err := os.MkdirAll(o.Dir, 0o755); err != nil {
		return nil, err
	}
	leaves := []string{CollectorFile, CollectorKeyFile, ExporterFile, ExporterKeyFile, AgentFile, AgentKeyFile, ControllerFile, ControllerKeyFile}
	if !o.Force {
		for _, f := range leaves {
			if _, err := os.Stat(filepath.Join(o.Dir, f)); err == nil {
				return nil, fmt.Errorf("certs: %s exists (--force renews the certificates under the same CA)", filepath.Join(o.Dir, f))
			}
		}
	}
	out := &Issued{}
	ca, caKey, reused, err := loadOrCreateCA(o, out)
	if err != nil {
		return nil, err
	}
	out.CAReused = reused
	svc, ns := o.CollectorService, o.Namespace
	collectorDNS := append([]string{svc, svc + "." + ns, svc + "." + ns + ".svc", svc + "." + ns + ".svc." + o.ClusterDomain}, o.CollectorDNS...)
	for _, leaf := range []struct {
		cert, key string
		tmpl      x509.Certificate
	}{
		{CollectorFile, CollectorKeyFile, x509.Certificate{
			Subject: pkix.Name{CommonName: svc + "." + ns + ".svc"}, DNSNames: collectorDNS, IPAddresses: o.CollectorIPs,
			ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}},
		{ExporterFile, ExporterKeyFile, x509.Certificate{
			Subject: pkix.Name{CommonName: exporterCommonName}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}},
		{AgentFile, AgentKeyFile, x509.Certificate{
			Subject: pkix.Name{CommonName: o.AgentName}, DNSNames: []string{o.AgentName},
			ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}},
		{ControllerFile, ControllerKeyFile, x509.Certificate{
			Subject: pkix.Name{CommonName: controllerCN}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}},
	} {
		t := leaf.tmpl
		t.NotBefore, t.NotAfter = o.Now.Add(-5*time.Minute), o.Now.Add(o.Validity)
		t.KeyUsage = x509.KeyUsageDigitalSignature
		if err := issue(o.Dir, leaf.cert, leaf.key, &t, ca, caKey, out); err != nil {
			return nil, err
		}
	}
	return out, nil
}

func (o *Options) setDefaults() {
	o.Namespace = cmp.Or(o.Namespace, DefaultNamespace)
	o.CollectorService = cmp.Or(o.CollectorService, DefaultCollectorService)
	o.ClusterDomain = cmp.Or(o.ClusterDomain, DefaultClusterDomain)
	o.AgentName = cmp.Or(o.AgentName, DefaultAgentName)
	o.Validity = defaults.Positive(o.Validity, DefaultValidity)
	if o.Now.IsZero() {
		o.Now = time.Now()
	}
}

func loadOrCreateCA(o Options, out *Issued) (*x509.Certificate, *ecdsa.PrivateKey, bool, error) {
	certPath, keyPath := filepath.Join(o.Dir, CAFile), filepath.Join(o.Dir, CAKeyFile)
	certPEM, errC := os.ReadFile(certPath)
	keyPEM, errK := os.ReadFile(keyPath)
	switch {
	case errC == nil && errK == nil:
		cert, key, err := parsePair(certPEM, keyPEM)
		if err != nil {
			return nil, nil, false, fmt.Errorf("certs: existing CA in %s: %w", o.Dir, err)
		}
		if !cert.IsCA {
			return nil, nil, false, fmt.Errorf("certs: %s is not a CA certificate", certPath)
		}
		if o.Now.Add(o.Validity).After(cert.NotAfter) {
			return nil, nil, false, fmt.Errorf("certs: the CA in %s expires %s, before the certificates would; issue a new CA in another directory", o.Dir, cert.NotAfter.Format(time.DateOnly))
		}
		return cert, key, true, nil
	case errors.Is(errC, fs.ErrNotExist) && errors.Is(errK, fs.ErrNotExist):
	case errC != nil && !errors.Is(errC, fs.ErrNotExist):
		return nil, nil, false, errC
	case errK != nil && !errors.Is(errK, fs.ErrNotExist):
		return nil, nil, false, errK
	default:
		return nil, nil, false, fmt.Errorf("certs: %s holds one of %s and %s but not the other", o.Dir, CAFile, CAKeyFile)
	}
	tmpl := &x509.Certificate{
		Subject:   pkix.Name{CommonName: caCommonName},
		NotBefore: o.Now.Add(-5 * time.Minute), NotAfter: o.Now.Add(10 * o.Validity),
		IsCA: true, BasicConstraintsValid: true, MaxPathLenZero: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	if err := issue(o.Dir, CAFile, CAKeyFile, tmpl, nil, nil, out); err != nil {
		return nil, nil, false, err
	}
	certPEM, _ = os.ReadFile(certPath)
	keyPEM, _ = os.ReadFile(keyPath)
	cert, key, err := parsePair(certPEM, keyPEM)
	return cert, key, false, err
}

// issue creates a key and a certificate from tmpl, signed by ca (self-signed
// when ca is nil), and writes both.
func issue(dir, certFile, keyFile string, tmpl *x509.Certificate, ca *x509.Certificate, caKey *ecdsa.PrivateKey, out *Issued) error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return err
	}
	tmpl.SerialNumber = serial
	parent, signer := tmpl, key
	if ca != nil {
		parent, signer = ca, caKey
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, signer)
	if err != nil {
		return fmt.Errorf("certs: %s: %w", certFile, err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return err
	}
	if err := writeFile(filepath.Join(dir, keyFile), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		return err
	}
	if err := writeFile(filepath.Join(dir, certFile), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		return err
	}
	out.Files = append(out.Files, filepath.Join(dir, certFile), filepath.Join(dir, keyFile))
	return nil
}

// writeFile replaces path atomically with data.
func writeFile(path string, data []byte, mode os.FileMode) error {
	return atomicfile.Write(path, mode, func(w io.Writer) error { _, err := w.Write(data); return err })
}

func parsePair(certPEM, keyPEM []byte) (*x509.Certificate, *ecdsa.PrivateKey, error) {
	cb, _ := pem.Decode(certPEM)
	kb, _ := pem.Decode(keyPEM)
	if cb == nil || kb == nil {
		return nil, nil, errors.New("not PEM")
	}
	cert, err := x509.ParseCertificate(cb.Bytes)
	if err != nil {
		return nil, nil, err
	}
	k, err := x509.ParsePKCS8PrivateKey(kb.Bytes)
	if err != nil {
		return nil, nil, err
	}
	key, ok := k.(*ecdsa.PrivateKey)
	if !ok {
		return nil, nil, errors.New("the CA key is not ECDSA")
	}
	return cert, key, nil
}
