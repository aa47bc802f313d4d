// Package kubeapi runs a real Kubernetes API server for the tests: a
// kube-apiserver built from the k8s.io/kubernetes module pinned in
// tools/go.mod (scripts/kube-apiserver.sh builds and caches it under
// .cache/kube-apiserver/<version>/) on Debian's etcd, both on loopback
// only, with dual-stack Service CIDRs from the lab ranges, RBAC on, an
// admin token and ServiceAccount tokens through the TokenRequest API.
//
// There is no controller-manager, scheduler or kubelet: objects are what
// the test writes (see lab.Publish), namespaces need their "default"
// ServiceAccount created by hand, and pods their status.
//
//	s, err := kubeapi.Start(ctx, kubeapi.Options{Dir: t.TempDir()})
//	defer s.Stop()
//	kc, err := s.ServiceAccountKubeconfig(ctx, rbacYAML, "dualflow", "dualflow-collector")
package kubeapi

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/dualflow/dualflow/nsrun"
)

// ServiceCIDRs are the API server's Service ranges: the lab's ClusterIP
// ranges, both families.
const ServiceCIDRs = "198.19.0.0/16,fd00:10:ff::/108"

// EnvBinary names a kube-apiserver binary to use instead of the cached
// build.
const EnvBinary = "DUALFLOW_KUBE_APISERVER"

// Binary returns the kube-apiserver to run: $DUALFLOW_KUBE_APISERVER, or
// the build scripts/kube-apiserver.sh cached for the version pinned in
// tools/go.mod.
func Binary() (string, error) {
	if p := os.Getenv(EnvBinary); p != "" {
		return p, nil
	}
	root, err := repoRoot()
	if err != nil {
		return "", err
	}
	v, err := PinnedVersion()
	if err != nil {
		return "", err
	}
	cache := os.Getenv("DUALFLOW_CACHE")
	if cache == "" {
		cache = filepath.Join(root, ".cache")
	}
	p := filepath.Join(cache, "kube-apiserver", v, "kube-apiserver")
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("kube-apiserver %s is not built (run scripts/kube-apiserver.sh, which make test does): %w", v, err)
	}
	return p, nil
}

// PinnedVersion is the k8s.io/kubernetes version of tools/go.mod.
func PinnedVersion() (string, error) {
	root, err := repoRoot()
	if err != nil {
		return "", err
	}
	b, err := os.ReadFile(filepath.Join(root, "test", "kubeapi", "tools", "go.mod"))
	if err != nil {
		return "", err
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if f := strings.Fields(line); len(f) == 3 && f[0] == "require" && f[1] == "k8s.io/kubernetes" {
			return f[2], nil
		}
	}
	return "", errors.New("kubeapi: no k8s.io/kubernetes version in tools/go.mod")
}

func repoRoot() (string, error) {
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		return "", errors.New("kubeapi: cannot locate the repository")
	}
	return filepath.Abs(filepath.Join(filepath.Dir(file), "..", ".."))
}

// Options configure Start.
type Options struct {
	// Dir holds etcd's data, certificates, keys and logs (required; a
	// test's TempDir).
	Dir string
	// Binary is the kube-apiserver (default Binary()); Etcd the etcd
	// binary (default etcd on PATH).
	Binary, Etcd string
	// Log receives both processes' output (default: files in Dir).
	Log io.Writer
	// Address is where the API server listens and what it advertises
	// (default 127.0.0.1); Port its port (default: a free one). A real
	// cluster's nodes reach it on an address of the cluster's network.
	Address string
	Port    int
	// ServiceCIDRs is --service-cluster-ip-range (default ServiceCIDRs);
	// its first family is the kubernetes Service's.
	ServiceCIDRs string
	// Authorization is --authorization-mode (default RBAC).
	Authorization string
	// Users are more static-token users (a kubelet, kube-proxy, ...):
	// Kubeconfig writes their credentials.
	Users []User
	// ExtraArgs are appended to the API server's command line.
	ExtraArgs []string
	// NetNS, a /run/netns path, runs etcd and the API server inside that
	// network namespace (on its loopback ports 2379 and 2380, and Port or
	// 6443); the Server's clients dial into it.
	NetNS string
}

// User is a static-token user of the API server.
type User struct {
	Name   string
	Groups []string
}

// Server is a running etcd and kube-apiserver.
type Server struct {
	// URL is the API server's https URL on loopback.
	URL string
	// AdminKubeconfig is a kubeconfig file with the admin token
	// (system:masters); Admin is a clientset for it.
	AdminKubeconfig string
	Admin           kubernetes.Interface
	// Started is how long the API server took to answer /readyz.
	Started time.Duration

	dir        string
	caData     []byte
	adminToken string
	tokens     map[string]string // user -> token, Options.Users
	users      []User
	netns      string // Options.NetNS
	etcd, api  *exec.Cmd
	apiArgs    []string // the API server's command line, for Restart
	etcdURL    string
	logs       []*os.File
	waits      []chan error
	apiWait    chan error // the running API server's exit
	log        io.Writer
	apiStarts  int
}

// Start starts etcd and kube-apiserver and waits until the API server is
// ready (up to two minutes: a loaded machine). Stop kills both.
func Start(ctx context.Context, o Options) (*Server, error) {
	if o.Dir == "" {
		return nil, errors.New("kubeapi: Options.Dir is required")
	}
	if o.Binary == "" {
		b, err := Binary()
		if err != nil {
			return nil, err
		}
		o.Binary = b
	}
	if o.Etcd == "" {
		p, err := exec.LookPath("etcd")
		if err != nil {
			return nil, fmt.Errorf("kubeapi: etcd not found (apt-get install etcd-server): %w", err)
		}
		o.Etcd = p
	}
	// Ports picked free can be taken by someone else before the server
	// binds them: try again with new ones.
	var lastErr error
	for attempt := 0; attempt < 3; attempt++ {
		s, err := start(ctx, o, attempt)
		if err == nil {
			return s, nil
		}
		lastErr = err
		if ctx.Err() != nil || !errors.Is(err, errPortTaken) {
			break
		}
	}
	return nil, lastErr
}

var errPortTaken = errors.New("port taken")

func start(ctx context.Context, o Options, attempt int) (_ *Server, err error) {
	dir := filepath.Join(o.Dir, "kubeapi-"+strconv.Itoa(attempt))
	if err := os.MkdirAll(filepath.Join(dir, "certs"), 0o700); err != nil {
		return nil, err
	}
	s := &Server{dir: dir, netns: o.NetNS}
	defer func() {
		if err != nil {
			s.Stop()
		}
	}()
	ports := []int{2379, 2380, 6443} // a namespace of its own: free
	if o.NetNS == "" {
		if ports, err = freePorts(3); err != nil {
			return nil, err
		}
	}
	s.etcdURL = "http://127.0.0.1:" + strconv.Itoa(ports[0])
	peer := "http://127.0.0.1:" + strconv.Itoa(ports[1])
	s.etcd = s.command(o.Etcd,
		"--name", "kubeapi", "--data-dir", filepath.Join(dir, "etcd"),
		"--listen-client-urls", s.etcdURL, "--advertise-client-urls", s.etcdURL,
		"--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
		"--initial-cluster", "kubeapi="+peer, "--initial-cluster-state", "new",
		"--listen-metrics-urls", "", "--log-level", "warn",
		"--quota-backend-bytes", strconv.Itoa(1<<30))
	if err := s.spawn(s.etcd, "etcd", o.Log); err != nil {
		return nil, err
	}
	if err := waitFor(ctx, 60*time.Second, s.waits[0], func() bool {
		c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DialContext: s.Dial}}
		defer c.CloseIdleConnections()
		resp, err := c.Get(s.etcdURL + "/health")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}); err != nil {
		return nil, fmt.Errorf("etcd: %w%s", err, s.tail(0))
	}

	s.users = o.Users
	if err := s.writeSecrets(); err != nil {
		return nil, err
	}
	port := strconv.Itoa(ports[2])
	if o.Port != 0 {
		port = strconv.Itoa(o.Port)
	}
	addr, reconciler := "127.0.0.1", "none"
	if o.Address != "" {
		// A cluster with nodes: the kubernetes Service's endpoints name
		// the API server, for the pods.
		addr, reconciler = o.Address, "lease"
	}
	serviceCIDRs, authz := ServiceCIDRs, "RBAC"
	if o.ServiceCIDRs != "" {
		serviceCIDRs = o.ServiceCIDRs
	}
	if o.Authorization != "" {
		authz = o.Authorization
	}
	s.URL = "https://" + net.JoinHostPort(addr, port)
	s.apiArgs = []string{o.Binary,
		"--etcd-servers", s.etcdURL,
		"--bind-address", addr, "--secure-port", port, "--advertise-address", addr,
		"--endpoint-reconciler-type", reconciler,
		"--cert-dir", filepath.Join(dir, "certs"),
		"--token-auth-file", filepath.Join(dir, "tokens.csv"),
		"--authorization-mode", authz,
		"--service-account-issuer", Issuer,
		"--service-account-key-file", filepath.Join(dir, "sa.pem"),
		"--service-account-signing-key-file", filepath.Join(dir, "sa.pem"),
		"--service-cluster-ip-range", serviceCIDRs,
		// PodTopologyLabels (1.35+) stays on, as on a real cluster: it
		// copies a node's zone and region labels onto a pod created with
		// spec.nodeName after its node. The lab's pods carry those labels
		// already, so the stored objects do not depend on the order of
		// publication (TestKubePublishOrders checks it).
		"--enable-priority-and-fairness=false",
		"--profiling=false",
		"--v=1"}
	s.apiArgs = append(s.apiArgs, o.ExtraArgs...)
	s.log = o.Log
	if err := s.spawnAPI(); err != nil {
		return nil, err
	}
	began := time.Now()
	crt := filepath.Join(dir, "certs", "apiserver.crt")
	if err := waitFor(ctx, 5*time.Minute, s.apiWait, func() bool {
		if s.caData == nil {
			b, err := os.ReadFile(crt)
			if err != nil || !bytes.Contains(b, []byte("END CERTIFICATE")) {
				return false
			}
			s.caData = b
		}
		return s.ready()
	}); err != nil {
		log := s.tail(1)
		if strings.Contains(log, "address already in use") {
			return nil, fmt.Errorf("kube-apiserver: %w%s", errPortTaken, log)
		}
		return nil, fmt.Errorf("kube-apiserver: %w%s", err, log)
	}
	s.Started = time.Since(began)
	s.AdminKubeconfig = filepath.Join(dir, "admin.kubeconfig")
	if err := s.writeKubeconfig(s.AdminKubeconfig, "admin", s.adminToken); err != nil {
		return nil, err
	}
	rc, err := clientcmd.BuildConfigFromFlags("", s.AdminKubeconfig)
	if err != nil {
		return nil, err
	}
	// The tests write a lab's objects in a burst: client-go's default
	// rate limit (5 QPS) would make that take seconds.
	rc.QPS, rc.Burst = 200, 400
	rc.Dial = s.Dial
	if s.Admin, err = kubernetes.NewForConfig(rc); err != nil {
		return nil, err
	}
	return s, nil
}

// command is exec.Command, inside Options.NetNS if set (nsenter execs the
// binary: the process is the server, with StartTied's death signal).
func (s *Server) command(name string, args ...string) *exec.Cmd {
	if s.netns == "" {
		return exec.Command(name, args...)
	}
	return exec.Command("nsenter", append([]string{"--net=" + s.netns, "--", name}, args...)...)
}

// Dial dials addr from the API server's network namespace (Options.NetNS),
// or from this process's.
func (s *Server) Dial(ctx context.Context, network, addr string) (net.Conn, error) {
	var d net.Dialer
	if s.netns == "" {
		return d.DialContext(ctx, network, addr)
	}
	var c net.Conn
	err := nsrun.Do(s.netns, func() (err error) {
		c, err = d.DialContext(ctx, network, addr)
		return err
	})
	return c, err
}

// spawnAPI starts the API server with s.apiArgs.
func (s *Server) spawnAPI() error {
	s.api = s.command(s.apiArgs[0], s.apiArgs[1:]...)
	name := "kube-apiserver"
	if s.apiStarts++; s.apiStarts > 1 {
		name += "-" + strconv.Itoa(s.apiStarts) // keep the first run's log
	}
	if err := s.spawn(s.api, name, s.log); err != nil {
		return err
	}
	s.apiWait = s.waits[len(s.waits)-1]
	return nil
}

// Kill kills the API server (SIGKILL), as a crash or a node failure
// would, and waits for it to exit; etcd keeps running. Restart brings it
// back.
func (s *Server) Kill() {
	if s.api == nil || s.api.Process == nil {
		return
	}
	_ = syscall.Kill(-s.api.Process.Pid, syscall.SIGKILL)
	select {
	case <-s.apiWait:
	case <-time.After(30 * time.Second):
	}
	s.api, s.apiWait = nil, nil
}

// Restart starts the API server killed by Kill again, on the same port,
// certificates and etcd, and waits until it is ready (up to five minutes: several API servers start at once under make test on 2 cores).
func (s *Server) Restart(ctx context.Context) error {
	if s.api != nil {
		return errors.New("kubeapi: Restart: the API server is running")
	}
	if err := s.spawnAPI(); err != nil {
		return err
	}
	if err := waitFor(ctx, 5*time.Minute, s.apiWait, s.ready); err != nil {
		return fmt.Errorf("kube-apiserver restart: %w%s", err, s.tail(len(s.logs)-1))
	}
	return nil
}

// spawn starts cmd in its own process group with its output in a log.
func (s *Server) spawn(cmd *exec.Cmd, name string, w io.Writer) error {
	f, err := os.Create(filepath.Join(s.dir, name+".log"))
	if err != nil {
		return err
	}
	s.logs = append(s.logs, f)
	out := io.Writer(f)
	if w != nil {
		out = io.MultiWriter(f, w)
	}
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := StartTied(cmd); err != nil {
		return fmt.Errorf("kubeapi: start %s: %w", name, err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	s.waits = append(s.waits, done)
	return nil
}

// tail returns the end of process i's log, for an error message.
func (s *Server) tail(i int) string {
	if i >= len(s.logs) {
		return ""
	}
	b, _ := os.ReadFile(s.logs[i].Name())
	if len(b) > 3000 {
		b = b[len(b)-3000:]
	}
	return "\n--- " + filepath.Base(s.logs[i].Name()) + " ---\n" + string(b)
}

// waitFor polls ok every 100 ms until it is true, the process ends, or
// the timeout.
func waitFor(ctx context.Context, timeout time.Duration, exited chan error, ok func() bool) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for !ok() {
		select {
		case err := <-exited:
			exited <- err // for Stop
			return fmt.Errorf("exited early: %v", err)
		case <-ctx.Done():
			return fmt.Errorf("not ready: %w", ctx.Err())
		case <-t.C:
		}
	}
	return nil
}

func (s *Server) ready() bool {
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(s.caData)
	c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}, DialContext: s.Dial}}
	defer c.CloseIdleConnections()
	req, _ := http.NewRequest(http.MethodGet, s.URL+"/readyz", nil)
	req.Header.Set("Authorization", "Bearer "+s.adminToken)
	resp, err := c.Do(req)
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// writeSecrets writes the admin token file and the ServiceAccount
// signing key.
func (s *Server) writeSecrets() error {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		return err
	}
	s.adminToken = hex.EncodeToString(b)
	csv := s.adminToken + `,admin,admin-uid,"system:masters"` + "\n"
	s.tokens = map[string]string{}
	for _, u := range s.users {
		if _, err := rand.Read(b); err != nil {
			return err
		}
		s.tokens[u.Name] = hex.EncodeToString(b)
		csv += fmt.Sprintf("%s,%s,%s-uid,%q\n", s.tokens[u.Name], u.Name, u.Name, strings.Join(u.Groups, ","))
	}
	if err := os.WriteFile(filepath.Join(s.dir, "tokens.csv"), []byte(csv), 0o600); err != nil {
		return err
	}
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return err
	}
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return err
	}
	pub, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		return err
	}
	var pemBuf bytes.Buffer
	pem.Encode(&pemBuf, &pem.Block{Type: "PRIVATE KEY", Bytes: der})
	pem.Encode(&pemBuf, &pem.Block{Type: "PUBLIC KEY", Bytes: pub})
	return os.WriteFile(filepath.Join(s.dir, "sa.pem"), pemBuf.Bytes(), 0o600)
}

func (s *Server) writeKubeconfig(path, user, token string) error {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["kubeapi"] = &clientcmdapi.Cluster{Server: s.URL, CertificateAuthorityData: s.caData}
	cfg.AuthInfos[user] = &clientcmdapi.AuthInfo{Token: token}
	cfg.Contexts["kubeapi"] = &clientcmdapi.Context{Cluster: "kubeapi", AuthInfo: user}
	cfg.CurrentContext = "kubeapi"
	return clientcmd.WriteToFile(*cfg, path)
}

// CA is the PEM of the certificate that signs the API server's (its
// self-signed serving certificate).
func (s *Server) CA() []byte { return s.caData }

// ServiceAccountKey is the file of the key that signs ServiceAccount
// tokens (PKCS#8 private key, then the public key), for
// kube-controller-manager.
func (s *Server) ServiceAccountKey() string { return filepath.Join(s.dir, "sa.pem") }

// Kubeconfig writes a kubeconfig for the Options.Users user to path.
func (s *Server) Kubeconfig(path, user string) error {
	tok, ok := s.tokens[user]
	if !ok {
		return fmt.Errorf("kubeapi: no user %q in Options.Users", user)
	}
	return s.writeKubeconfig(path, user, tok)
}

// Token is the bearer token of the Options.Users user ("" for none).
func (s *Server) Token(user string) string { return s.tokens[user] }

// Issuer is the issuer (and default audience) of the ServiceAccount
// tokens the API server signs.
const Issuer = "https://kubernetes.default.svc"

// RESTConfig is the admin's client configuration.
func (s *Server) RESTConfig() (*rest.Config, error) {
	rc, err := clientcmd.BuildConfigFromFlags("", s.AdminKubeconfig)
	if err == nil {
		rc.Dial = s.Dial
	}
	return rc, err
}

// ServiceAccountKubeconfig applies an RBAC manifest (ServiceAccount,
// ClusterRole, ClusterRoleBinding, Role, RoleBinding documents; the
// ServiceAccount's namespace is created if missing), requests a token for
// ServiceAccount namespace/name through the TokenRequest API, and writes a
// kubeconfig with it. It returns the kubeconfig's path.
func (s *Server) ServiceAccountKubeconfig(ctx context.Context, rbac []byte, namespace, name string) (string, error) {
	if err := s.Apply(ctx, rbac); err != nil {
		return "", err
	}
	tr, err := s.Admin.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, name, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: new(int64(24 * 3600))},
	}, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("kubeapi: token for %s/%s: %w", namespace, name, err)
	}
	path := filepath.Join(s.dir, namespace+"-"+name+".kubeconfig")
	return path, s.writeKubeconfig(path, namespace+"-"+name, tr.Status.Token)
}

// Apply creates the RBAC and ServiceAccount objects of a YAML stream
// (objects that exist are left as they are).
func (s *Server) Apply(ctx context.Context, manifest []byte) error {
	dec := serializer.NewCodecFactory(scheme.Scheme).UniversalDeserializer()
	yr := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(manifest)))
	for {
		doc, err := yr.Read()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		if len(bytes.TrimSpace(doc)) == 0 {
			continue
		}
		obj, _, err := dec.Decode(doc, nil, nil)
		if err != nil {
			return fmt.Errorf("kubeapi apply: %w", err)
		}
		switch o := obj.(type) {
		case *corev1.ServiceAccount:
			ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: o.Namespace}}
			if _, err := s.Admin.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
				return fmt.Errorf("kubeapi apply: namespace %s: %w", o.Namespace, err)
			}
			_, err = s.Admin.CoreV1().ServiceAccounts(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		case *rbacv1.ClusterRole:
			_, err = s.Admin.RbacV1().ClusterRoles().Create(ctx, o, metav1.CreateOptions{})
		case *rbacv1.ClusterRoleBinding:
			_, err = s.Admin.RbacV1().ClusterRoleBindings().Create(ctx, o, metav1.CreateOptions{})
		case *rbacv1.Role:
			_, err = s.Admin.RbacV1().Roles(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		case *rbacv1.RoleBinding:
			_, err = s.Admin.RbacV1().RoleBindings(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		default:
			return fmt.Errorf("kubeapi apply: %T is not an RBAC object", obj)
		}
		if err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("kubeapi apply: %w", err)
		}
	}
}

// Stop kills the API server, then etcd, and waits for both. It is safe to
// call more than once.
func (s *Server) Stop() {
	s.Kill()
	if cmd := s.etcd; cmd != nil && cmd.Process != nil {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		if len(s.waits) > 0 && s.waits[0] != nil { // etcd's, started first
			select {
			case <-s.waits[0]:
			case <-time.After(30 * time.Second):
			}
			s.waits[0] = nil
		}
	}
	s.etcd = nil
	for _, f := range s.logs {
		f.Close()
	}
	s.logs = nil
}

// spawnReqs feeds the spawner: one goroutine locked to its OS thread for
// the life of the process, which starts every tied process.
var spawnReqs = make(chan spawnReq)

type spawnReq struct {
	cmd  *exec.Cmd
	done chan error
}

func init() {
	go func() {
		// Pdeathsig fires when the thread that forked the child ends, not
		// the process: Go ends threads that a goroutine left locked (the
		// lab's netns code does), which would kill the child mid-test. This
		// thread never ends.
		runtime.LockOSThread()
		for r := range spawnReqs {
			r.done <- r.cmd.Start()
		}
	}()
}

// StartTied starts cmd so that it is killed (SIGKILL) when the test
// process dies, even by a signal that skips every cleanup.
func StartTied(cmd *exec.Cmd) error {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	r := spawnReq{cmd, make(chan error, 1)}
	spawnReqs <- r
	return <-r.done
}

// freePorts returns n loopback TCP ports that were free a moment ago.
func freePorts(n int) ([]int, error) {
	var lns []net.Listener
	defer func() {
		for _, ln := range lns {
			ln.Close()
		}
	}()
	var out []int
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		lns = append(lns, ln)
		out = append(out, ln.Addr().(*net.TCPAddr).Port)
	}
	return out, nil
}
