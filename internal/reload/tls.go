package reload

import (
	"cmp"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"time"
)

// TLSFiles name the PEM files of one end of TLS connections.
type TLSFiles struct {
	// Cert and Key are this end's certificate (chain first) and private
	// key: both or neither.
	Cert, Key string
	// CA verifies the other end: a server's certificate, for a client
	// (empty: the system's roots); a client's certificate, for a server,
	// which then requires one (mutual TLS; empty: none asked).
	CA string
}

// TLS is the content of TLSFiles, reloaded when the files change: the
// configurations it returns pick the current certificate and CA at each
// handshake, so new connections use new files and established ones go
// on. Its methods are safe for concurrent use.
type TLS struct {
	files TLSFiles
	f     *File[*tlsContent]
}

type tlsContent struct {
	cert  *tls.Certificate // nil without TLSFiles.Cert
	roots *x509.CertPool   // nil without TLSFiles.CA
}

func (c *tlsContent) notAfter() time.Time {
	if c.cert == nil || c.cert.Leaf == nil {
		return time.Time{}
	}
	return c.cert.Leaf.NotAfter
}

// LoadTLS loads files and returns their TLS, reloaded as Options say.
// Nothing to load (no Cert, no CA) is an error: the caller has no TLS.
func LoadTLS(files TLSFiles, o Options) (*TLS, error) {
	if (files.Cert == "") != (files.Key == "") {
		return nil, errors.New("tls: a certificate file needs its key file and the key its certificate")
	}
	var paths []string
	for _, p := range []string{files.Cert, files.Key, files.CA} {
		if p != "" {
			paths = append(paths, p)
		}
	}
	if len(paths) == 0 {
		return nil, errors.New("tls: no certificate and no CA file")
	}
	f, err := NewFile(o, func() (*tlsContent, error) { return loadTLS(files) }, paths...)
	if err != nil {
		return nil, err
	}
	return &TLS{files: files, f: f}, nil
}

func loadTLS(files TLSFiles) (*tlsContent, error) {
	var c tlsContent
	if files.Cert != "" {
		// LoadX509KeyPair refuses a key that does not match the
		// certificate, and sets Leaf.
		cert, err := tls.LoadX509KeyPair(files.Cert, files.Key)
		if err != nil {
			return nil, fmt.Errorf("tls certificate %s, key %s: %w", files.Cert, files.Key, err)
		}
		c.cert = &cert
	}
	if files.CA != "" {
		roots, err := ReadCAPool(files.CA)
		if err != nil {
			return nil, fmt.Errorf("tls CA: %w", err)
		}
		c.roots = roots
	}
	return &c, nil
}

// ReadCAPool reads a PEM file of CA certificates; a file without one is
// an error.
func ReadCAPool(path string) (*x509.CertPool, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	p := x509.NewCertPool()
	if !p.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("%s: no PEM certificate", path)
	}
	return p, nil
}

// NotAfter is when the certificate in use expires (zero without one).
func (t *TLS) NotAfter() time.Time { return t.f.Get().notAfter() }

func (t *TLS) stats() stats { return t.f.stats() }

// ServerConfig returns a server configuration presenting the current
// certificate (TLSFiles.Cert is required) and, with TLSFiles.CA, requiring
// a client certificate that the current CA verifies.
//
// The client's certificate is verified in VerifyConnection rather than by
// crypto/tls against Config.ClientCAs, which a running listener's
// configuration cannot change; GetConfigForClient could swap the whole
// configuration, but would lose what a server adds to it (http.Server's
// ALPN protocols). VerifyConnection also runs on resumed sessions, so a
// CA taken out refuses those as well.
func (t *TLS) ServerConfig() *tls.Config {
	c := &tls.Config{
		MinVersion: tls.VersionTLS12,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			if cert := t.f.Get().cert; cert != nil {
				return cert, nil
			}
			return nil, errors.New("tls: no server certificate configured")
		},
	}
	if t.files.CA != "" {
		c.ClientAuth = tls.RequireAnyClientCert // verified just below
		c.VerifyConnection = func(cs tls.ConnectionState) error {
			return verify(cs.PeerCertificates, t.f.Get().roots, "", x509.ExtKeyUsageClientAuth)
		}
	}
	return c
}

// ErrNoServerName is returned by a handshake of ClientConfig("") with a
// server dialled by IP address: the name to check is not known.
var ErrNoServerName = errors.New("tls: the server was dialled by IP address and no server name is set: its certificate cannot be checked against the CA file (set the name it holds)")

// ClientConfig returns a client configuration presenting the current
// certificate (when TLSFiles.Cert is set) and verifying the server for
// serverName (empty: the host dialled) against the current CA (the
// system's roots without TLSFiles.CA).
//
// With a CA file, the server's certificate is verified in
// VerifyConnection, against the CA of the moment, rather than by
// crypto/tls against a RootCAs fixed in the configuration
// (InsecureSkipVerify only turns the latter off). That check knows the
// host dialled only when it is a DNS name (sent as SNI): a client that
// dials IP addresses must pass the name to check, the address itself if
// need be, here.
func (t *TLS) ClientConfig(serverName string) *tls.Config {
	c := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: serverName}
	if t.files.Cert != "" {
		c.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			return t.f.Get().cert, nil
		}
	}
	if t.files.CA != "" {
		c.InsecureSkipVerify = true // verified just below, and only there
		c.VerifyConnection = func(cs tls.ConnectionState) error {
			name := cmp.Or(serverName, cs.ServerName)
			if name == "" {
				return ErrNoServerName
			}
			return verify(cs.PeerCertificates, t.f.Get().roots, name, x509.ExtKeyUsageServerAuth)
		}
	}
	return c
}

// verify checks a peer's chain as crypto/tls would: against roots, for
// name when set, for usage.
func verify(certs []*x509.Certificate, roots *x509.CertPool, name string, usage x509.ExtKeyUsage) error {
	if len(certs) == 0 {
		return errors.New("tls: the peer sent no certificate")
	}
	opts := x509.VerifyOptions{Roots: roots, DNSName: name, Intermediates: x509.NewCertPool(),
		KeyUsages: []x509.ExtKeyUsage{usage}}
	for _, c := range certs[1:] {
		opts.Intermediates.AddCert(c)
	}
	if _, err := certs[0].Verify(opts); err != nil {
		return &tls.CertificateVerificationError{UnverifiedCertificates: certs, Err: err}
	}
	return nil
}
