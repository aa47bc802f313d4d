package e2e

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/dualflow/dualflow/collector/store/chhttp"
	"github.com/dualflow/dualflow/flow"
	"github.com/dualflow/dualflow/lab"
	"github.com/dualflow/dualflow/lab/agent"
	"github.com/dualflow/dualflow/lab/manifest"
)

// exporterCaps are the capabilities of the exporter container that reads
// another network namespace (--exporter.netns), all others dropped, as root
// (uid 0): NET_ADMIN for conntrack netlink (dump, events), SYS_ADMIN to join
// the namespace (setns). Measured: with NET_ADMIN alone it fails at start
// ("setns: operation not permitted"); with SYS_ADMIN alone it starts and
// exports nothing. A DaemonSet on hostNetwork reads its own namespace and
// needs NET_ADMIN only (checkHostNetworkExporter).
const exporterCaps = "NET_ADMIN,SYS_ADMIN"

// nonRootUID is the images' non-root user (scripts/image.sh).
const nonRootUID = 65532

// imageScript is scripts/image.sh from this package's directory.
const imageScript = "../../scripts/image.sh"

// TestImage runs the container images of `make image` (scripts/image.sh,
// FROM scratch) in each mode: the collector (dualflow-chdb, embedded store
// in a temporary directory mounted into the container, non-root) on the
// host network bound to loopback, and one exporter per lab node (dualflow,
// root with exactly exporterCaps) on the host network reading the node's
// conntrack through --exporter.netns, as a hostNetwork DaemonSet does. Pod
// traffic of each family of the mode must land in the store, merged from
// both nodes. Logs the images' sizes and the time from `podman run` to the
// collector's /readyz.
//
// It uses the images tagged $DUALFLOW_IMAGE_TAG in the private storage of
// scripts/image.sh (make image), else builds them under a tag of its own
// and removes them at the end.
func TestImage(t *testing.T) {
	requirePrereqs(t)
	requireCHDB(t)
	requirePodman(t)
	t.Parallel() // its own containers (named for the process and mode), labs and stores; the modes one after the other, each runs the 700 MB chDB image
	tag := imageTag(t)
	for _, img := range []string{"dualflow", "dualflow-chdb"} {
		out, err := podman("image", "inspect", "--format", "{{.Size}}", "localhost/"+img+":"+tag).Output()
		if err != nil {
			t.Fatalf("image %s:%s: %v", img, tag, err)
		}
		n, _ := strconv.ParseInt(strings.TrimSpace(string(out)), 10, 64)
		t.Logf("image %s:%s: %d MB", img, tag, n/1e6)
	}
	for _, mode := range manifest.Modes {
		t.Run(string(mode), func(t *testing.T) {
			record(t, mode)
			testImageMode(t, tag, mode)
		})
	}
}

// requirePodman skips (or with DUALFLOW_E2E=1 fails) without podman,
// buildah and runc (scripts/deps.sh installs them).
func requirePodman(t *testing.T) {
	t.Helper()
	var missing []string
	for _, bin := range []string{"podman", "buildah", "runc"} {
		if _, err := exec.LookPath(bin); err != nil {
			missing = append(missing, bin)
		}
	}
	if len(missing) == 0 {
		return
	}
	msg := "image e2e prerequisites missing: " + strings.Join(missing, ", ") + " (apt-get install podman buildah runc)"
	if os.Getenv("DUALFLOW_E2E") == "1" {
		t.Fatal(msg + " (DUALFLOW_E2E=1 requires them)")
	}
	t.Skip(msg)
}

// podman returns podman on the private storage of scripts/image.sh.
func podman(args ...string) *exec.Cmd {
	return exec.Command(imageScript, append([]string{"podman"}, args...)...)
}

// imageTag returns $DUALFLOW_IMAGE_TAG or builds the images under a tag of
// this process, removed when the test ends.
func imageTag(t *testing.T) string {
	t.Helper()
	if tag := os.Getenv("DUALFLOW_IMAGE_TAG"); tag != "" {
		return tag
	}
	tag := fmt.Sprintf("e2e-%d", os.Getpid())
	cmd := exec.Command(imageScript)
	cmd.Env = append(os.Environ(), "IMAGE_TAG="+tag, "IMAGE_ARCHIVE=0")
	t.Cleanup(func() {
		if out, err := podman("rmi", "-f", "localhost/dualflow-chdb:"+tag, "localhost/dualflow:"+tag).CombinedOutput(); err != nil {
			t.Errorf("podman rmi: %v\n%s", err, out)
		}
	})
	start := time.Now()
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("scripts/image.sh: %v\n%s", err, out)
	}
	t.Logf("images built in %v (scripts/image.sh)", time.Since(start).Round(time.Second))
	return tag
}

// container is a `podman run` in the foreground, its output in a log file.
type container struct {
	name   string
	log    string
	exited chan error
	mu     sync.Mutex
	lines  []string
}

// runContainer starts `podman run --rm --name name args...` and removes the
// container when the test ends. onLine sees each output line.
func runContainer(t *testing.T, name string, args ...string) *container {
	t.Helper()
	c := &container{name: name, log: filepath.Join(t.TempDir(), name+".log"), exited: make(chan error, 1)}
	_ = podman("rm", "-f", "-t", "0", name).Run() // a leftover of a killed run
	cmd := podman(append([]string{"run", "--rm", "--name", name}, args...)...)
	lf, err := os.Create(c.log)
	if err != nil {
		t.Fatal(err)
	}
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = io.MultiWriter(lf, pw), io.MultiWriter(lf, pw)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			c.mu.Lock()
			c.lines = append(c.lines, sc.Text())
			c.mu.Unlock()
		}
		_, _ = io.Copy(io.Discard, pr)
	}()
	go func() { c.exited <- cmd.Wait(); pw.Close(); lf.Close() }()
	t.Cleanup(func() {
		if out, err := podman("rm", "-f", "-t", "10", name).CombinedOutput(); err != nil {
			t.Errorf("podman rm %s: %v\n%s", name, err, out)
		}
		select {
		case <-c.exited:
		case <-time.After(30 * time.Second):
			t.Errorf("podman run %s did not end", name)
			_ = cmd.Process.Kill()
		}
		if t.Failed() {
			b, _ := os.ReadFile(c.log)
			if len(b) > 4000 {
				b = b[len(b)-4000:]
			}
			t.Logf("%s log (end):\n%s", name, b)
		}
	})
	return c
}

// find returns the first submatch of re in the output so far ("" if none).
func (c *container) find(re interface{ FindStringSubmatch(string) []string }) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, l := range c.lines {
		if m := re.FindStringSubmatch(l); m != nil {
			return m[1]
		}
	}
	return ""
}

// contains reports whether a line of the output so far contains s.
func (c *container) contains(s string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, l := range c.lines {
		if strings.Contains(l, s) {
			return true
		}
	}
	return false
}

// wait waits up to d for ok, failing when the container exits first.
func (c *container) wait(t *testing.T, what string, d time.Duration, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !ok() {
		select {
		case err := <-c.exited:
			c.exited <- err
			t.Fatalf("%s exited waiting for %s: %v", c.name, what, err)
		case <-time.After(200 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
	}
}

func testImageMode(t *testing.T, tag string, mode manifest.Mode) {
	l := startLab(t, mode)
	// The store directory belongs to the images' non-root user.
	store := filepath.Join(t.TempDir(), "store")
	if err := os.Mkdir(store, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(store, nonRootUID, nonRootUID); err != nil {
		t.Fatal(err)
	}
	// The lab's manifest (root's) as the inventory, readable by that user.
	inv := filepath.Join(t.TempDir(), "inventory.yaml")
	if b, err := os.ReadFile(l.ManifestPath()); err != nil {
		t.Fatal(err)
	} else if err := os.WriteFile(inv, b, 0o644); err != nil {
		t.Fatal(err)
	}
	loop := "127.0.0.1"
	if mode != manifest.ModeIPv4 {
		loop = "[::1]" // the exporters speak IPFIX over the mode's (first) family
	}
	name := fmt.Sprintf("%s%d-%s", prefixRoot, os.Getpid(), mode)
	start := time.Now()
	col := runContainer(t, name+"-collector",
		"--network", "host", "--user", fmt.Sprintf("%d:%d", nonRootUID, nonRootUID), "--cap-drop", "all",
		"-v", store+":/var/lib/dualflow/store",
		"-v", inv+":/etc/dualflow/inventory.yaml:ro",
		"localhost/dualflow-chdb:"+tag, "collector",
		"--clickhouse.data-dir", "/var/lib/dualflow/store/data",
		"--clickhouse.http-addr", "127.0.0.1:0",
		"--clickhouse.flush-interval", "200ms",
		"--metrics-addr", loop+":0",
		"--web.addr", loop+":0",
		"--collector.ipfix.tcp-addr", loop+":0",
		"--collector.ipfix.udp-addr", "",
		"--k8s.inventory", "/etc/dualflow/inventory.yaml",
		"--collector.correlate.timeout", "3s",
	)
	var metrics string
	col.wait(t, "the collector's metrics address", 3*time.Minute, func() bool {
		metrics = col.find(logMetrics)
		return metrics != ""
	})
	col.wait(t, "the collector's /readyz", 3*time.Minute, func() bool {
		resp, err := http.Get(metrics + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	t.Logf("collector container: podman run to /readyz in %v", time.Since(start).Round(time.Millisecond))
	// The collector logs its addresses before it is ready, but the
	// container's output reaches the test through podman and a pipe, and
	// may lag behind /readyz (it did by a line, the IPFIX address, once).
	var ipfixAddr, chURL, web string
	col.wait(t, "the collector's addresses in its log", time.Minute, func() bool {
		ipfixAddr, chURL, web = col.find(logIPFIXTCP), col.find(logCHHTTP), col.find(logWebURL)
		return ipfixAddr != "" && chURL != "" && web != ""
	})
	if resp, err := http.Get(web + "/"); err != nil || resp.StatusCode != http.StatusOK {
		t.Errorf("web %s: %v %v", web, err, resp)
	} else {
		resp.Body.Close()
	}

	for _, node := range []string{"node-1", "node-2"} {
		ns := l.NodeNetNSPath(node)
		e := runContainer(t, name+"-exporter-"+node,
			"--network", "host", "--user", "0:0", "--cap-drop", "all", "--cap-add", exporterCaps,
			"-v", filepath.Dir(ns)+":"+filepath.Dir(ns)+":ro",
			"localhost/dualflow:"+tag, "exporter",
			"--node-name", node,
			"--exporter.netns", ns,
			"--exporter.ipv4="+strconv.FormatBool(mode.Has(corev1.IPv4Protocol)),
			"--exporter.ipv6="+strconv.FormatBool(mode.Has(corev1.IPv6Protocol)),
			"--exporter.require-accounting",
			"--exporter.poll-interval", "200ms",
			"--exporter.idle-timeout", "1s",
			"--exporter.ipfix.collector", ipfixAddr,
			"--exporter.ipfix.flush-interval", "50ms",
			"--metrics-addr", "",
		)
		e.wait(t, node+"'s exporter to start", time.Minute, func() bool { return e.contains("exporter started") })
	}

	web1, err := l.PodOn(manifest.NSFrontend, "web", 1)
	if err != nil {
		t.Fatal(err)
	}
	api2, err := l.PodOn(manifest.NSBackend, "api", 2)
	if err != nil {
		t.Fatal(err)
	}
	users, err := chhttp.LoadUsers(filepath.Join(store, "data", "http-users.json"))
	if err != nil {
		t.Fatal(err)
	}
	admin, _ := chhttp.Find(users, chhttp.AdminUser)
	for _, f := range mode.Families() {
		a, _ := manifest.PodAddr(api2, f)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		r, err := labDial(ctx, l, web1, agent.TCP, netip.AddrPortFrom(a, manifest.PortHTTP))
		cancel()
		if err != nil {
			t.Fatalf("%s: web -> api: %v", f, err)
		}
		q := fmt.Sprintf(`SELECT correlation, src_node, dst_node, src_pod_name, dst_pod_name FROM dualflow.flows
			WHERE ip_version = %d AND protocol = %d AND src_port = %d ORDER BY flow_end FORMAT TSV`,
			flow.Version(r.Local.Addr()), flow.ProtoTCP, r.Local.Port())
		var got string
		col.wait(t, fmt.Sprintf("%s row of %v -> %v", f, r.Local, a), time.Minute, func() bool {
			got = chQuery(t, chURL, admin, q)
			return strings.HasPrefix(got, "merged\t")
		})
		t.Logf("%s: %v -> %v: %s", f, r.Local, a, got)
		if want := "merged\tnode-1\tnode-2\t" + web1.Name + "\t" + api2.Name; !strings.HasPrefix(got, want) {
			t.Errorf("%s: row %q, want %q", f, got, want)
		}
	}
	checkHostNetworkExporter(t, l, tag, name, mode)
}

// checkHostNetworkExporter runs the exporter image as a hostNetwork
// DaemonSet runs it, in node-1's network namespace itself (no setns), with
// NET_ADMIN only, and reads its metrics there: it must see the node's
// conntrack entries of each family of the mode (dump) and the connections
// made after its start (events). Its collector does not exist (the node's
// namespace cannot reach the host's loopback); records wait in its buffer.
func checkHostNetworkExporter(t *testing.T, l *lab.Lab, tag, name string, mode manifest.Mode) {
	ns := l.NodeNetNSPath("node-1")
	e := runContainer(t, name+"-exporter-hostnet",
		"--network", "ns:"+ns, "--user", "0:0", "--cap-drop", "all", "--cap-add", "NET_ADMIN",
		"localhost/dualflow:"+tag, "exporter",
		"--node-name", "node-1",
		"--exporter.require-accounting",
		"--exporter.poll-interval", "200ms",
		"--exporter.ipfix.collector", "127.0.0.1:4739",
		"--metrics-addr", "127.0.0.1:9465",
	)
	e.wait(t, "the hostNetwork exporter to start", time.Minute, func() bool { return e.contains("exporter started") })
	web1, _ := l.PodOn(manifest.NSFrontend, "web", 1)
	api2, _ := l.PodOn(manifest.NSBackend, "api", 2)
	for _, f := range mode.Families() {
		a, _ := manifest.PodAddr(api2, f)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, err := labDial(ctx, l, web1, agent.TCP, netip.AddrPortFrom(a, manifest.PortHTTP))
		cancel()
		if err != nil {
			t.Fatalf("%s: web -> api: %v", f, err)
		}
	}
	var metrics string
	e.wait(t, "the hostNetwork exporter's connections of each family and events", time.Minute, func() bool {
		out, err := exec.Command("ip", "netns", "exec", filepath.Base(ns), "curl", "-sf", "http://127.0.0.1:9465/metrics").Output()
		if err != nil {
			return false
		}
		metrics = string(out)
		for _, f := range mode.Families() {
			fam := map[corev1.IPFamily]string{corev1.IPv4Protocol: "ipv4", corev1.IPv6Protocol: "ipv6"}[f]
			if !metricPositive(metrics, `dualflow_exporter_connections{family="`+fam+`"}`) {
				return false
			}
		}
		return metricPositive(metrics, `dualflow_exporter_conntrack_events_total{type="new"}`)
	})
	t.Logf("hostNetwork exporter with NET_ADMIN only: conntrack dumps and events of %v", mode.Families())
}

// metricPositive reports whether the sample named series (with its labels)
// is in the exposition text and above zero.
func metricPositive(text, series string) bool {
	for line := range strings.SplitSeq(text, "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			n, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			return err == nil && n > 0
		}
	}
	return false
}

// chQuery runs q over the ClickHouse HTTP interface at url as u.
func chQuery(t *testing.T, url string, u chhttp.User, q string) string {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, url+"/", strings.NewReader(q))
	req.SetBasicAuth(u.Name, u.Password)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("query %q: %d %s", q, resp.StatusCode, b)
	}
	return strings.TrimSpace(string(b))
}
