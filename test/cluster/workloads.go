package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os/exec"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dualflow/dualflow/traceflow/podns"
)

// Workload namespaces and names of the test workloads.
const (
	NSClient = "shop"
	NSServer = "backend"
	// ServerPort (TCP) and ServerUDPPort are the servers' ports.
	ServerPort    = 8080
	ServerUDPPort = 5353
)

// Services of the server Deployment: one RequireDualStack (dual mode
// only), and a single-stack one per family of the mode.
const (
	SvcDual = "api"
	SvcV4   = "api-v4"
	SvcV6   = "api-v6"
)

// DeployWorkloads runs the test workloads, from the dualflow image (the
// lab's pod agent: `dualflow lab agent serve` answers each TCP connection
// and UDP datagram with its name and the address it saw): Deployment web
// (2 replicas) in shop, api (2 replicas) in backend, each spread over both
// nodes, and api's Services. It waits until they are available.
func (c *Cluster) DeployWorkloads(ctx context.Context, tag string) error {
	var b strings.Builder
	for _, ns := range []string{NSClient, NSServer} {
		fmt.Fprintf(&b, "apiVersion: v1\nkind: Namespace\nmetadata: {name: %s}\n---\n", ns)
	}
	for _, d := range []struct{ ns, name string }{{NSClient, "web"}, {NSServer, "api"}} {
		fmt.Fprintf(&b, workloadTemplate, d.name, d.ns, tag, ServerPort, ServerUDPPort)
	}
	type svc struct {
		name, policy, families string
	}
	var svcs []svc
	if c.plan.v4() && c.plan.v6() {
		svcs = append(svcs, svc{SvcDual, "RequireDualStack", "[IPv4, IPv6]"})
	}
	if c.plan.v4() {
		svcs = append(svcs, svc{SvcV4, "SingleStack", "[IPv4]"})
	}
	if c.plan.v6() {
		svcs = append(svcs, svc{SvcV6, "SingleStack", "[IPv6]"})
	}
	for _, s := range svcs {
		fmt.Fprintf(&b, serviceTemplate, s.name, NSServer, s.policy, s.families, ServerPort, ServerUDPPort)
	}
	if _, err := c.Kubectl(ctx, strings.NewReader(b.String()), "apply", "-f", "-"); err != nil {
		return err
	}
	for _, d := range []struct{ ns, name string }{{NSClient, "web"}, {NSServer, "api"}} {
		if _, err := c.Kubectl(ctx, nil, "-n", d.ns, "rollout", "status", "deployment/"+d.name, "--timeout=3m"); err != nil {
			return err
		}
	}
	return nil
}

const workloadTemplate = `apiVersion: apps/v1
kind: Deployment
metadata: {name: %[1]s, namespace: %[2]s}
spec:
  replicas: 2
  selector: {matchLabels: {app: %[1]s}}
  template:
    metadata: {labels: {app: %[1]s}}
    spec:
      topologySpreadConstraints:
      - {maxSkew: 1, topologyKey: kubernetes.io/hostname, whenUnsatisfiable: DoNotSchedule, labelSelector: {matchLabels: {app: %[1]s}}}
      terminationGracePeriodSeconds: 2
      containers:
      - name: agent
        image: localhost/dualflow:%[3]s
        imagePullPolicy: Never
        args: [lab, agent, serve, --name, $(NS)/$(POD), --tcp, "%[4]d", --udp, "%[5]d"]
        env:
        - {name: NS, valueFrom: {fieldRef: {fieldPath: metadata.namespace}}}
        - {name: POD, valueFrom: {fieldRef: {fieldPath: metadata.name}}}
        ports: [{name: http, containerPort: %[4]d}, {name: dns, containerPort: %[5]d, protocol: UDP}]
        readinessProbe: {tcpSocket: {port: %[4]d}, periodSeconds: 2}
        securityContext: {allowPrivilegeEscalation: false, runAsNonRoot: true, capabilities: {drop: [ALL]}}
---
`

const serviceTemplate = `apiVersion: v1
kind: Service
metadata: {name: %[1]s, namespace: %[2]s}
spec:
  selector: {app: api}
  ipFamilyPolicy: %[3]s
  ipFamilies: %[4]s
  ports:
  - {name: http, port: 80, targetPort: %[5]d}
  - {name: dns, port: 53, targetPort: %[6]d, protocol: UDP}
---
`

// Pods returns the running pods of an app label in a namespace.
func (c *Cluster) Pods(ctx context.Context, ns, app string) ([]corev1.Pod, error) {
	list, err := c.API.Admin.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app=" + app})
	if err != nil {
		return nil, err
	}
	var out []corev1.Pod
	for _, p := range list.Items {
		if p.Status.Phase == corev1.PodRunning && p.DeletionTimestamp == nil {
			out = append(out, p)
		}
	}
	return out, nil
}

// PodNetNS finds the network namespace of a pod that containerd started
// by its address, through /proc and the runtime's bind mounts alone (no
// runtime API): with the traceflow node agent's own finder.
func PodNetNS(pod *corev1.Pod) (string, error) {
	a, err := netip.ParseAddr(pod.Status.PodIP)
	if err != nil {
		return "", fmt.Errorf("pod %s/%s: no address yet", pod.Namespace, pod.Name)
	}
	ns, err := podNamespaces.Find(a)
	if err != nil {
		return "", fmt.Errorf("pod %s/%s at %s: %w", pod.Namespace, pod.Name, a, err)
	}
	return ns.Path, nil
}

var podNamespaces podns.Finder

// PodCounter counts, inside a pod's own network namespace, the bytes and
// packets of its client connections to ports 80 and 8080 (an nftables
// table of the test's: the pod's own count, independent of the node's
// conntrack that the exporter reads). Counters include IP headers, as
// conntrack's do.
type PodCounter struct{ netns string }

const counterTable = `table inet dualflow_count
delete table inet dualflow_count
table inet dualflow_count {
	counter sent {}
	counter syn {}
	counter received {}
	chain out {
		type filter hook output priority 0;
		tcp dport { 80, 8080 } counter name "sent";
		tcp dport { 80, 8080 } tcp flags & (syn | ack) == syn counter name "syn";
	}
	chain in { type filter hook input priority 0; tcp sport { 80, 8080 } counter name "received"; }
}
`

// NewPodCounter installs the counters in the namespace at netns.
func NewPodCounter(ctx context.Context, netns string) (*PodCounter, error) {
	pc := &PodCounter{netns: netns}
	_, err := pc.nft(ctx, counterTable, "-f", "-")
	return pc, err
}

func (pc *PodCounter) nft(ctx context.Context, stdin string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, "nsenter", append([]string{"--net=" + pc.netns, "--", "nft"}, args...)...)
	cmd.Stdin = strings.NewReader(stdin)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("nft %s in %s: %w: %s", strings.Join(args, " "), pc.netns, err, out)
	}
	return out, nil
}

// Reset zeroes the counters.
func (pc *PodCounter) Reset(ctx context.Context) error {
	_, err := pc.nft(ctx, "", "reset", "counters", "table", "inet", "dualflow_count")
	return err
}

// Count is what a PodCounter counted: the packets and bytes each way,
// and of the sent ones the SYNs (more than one: retransmitted).
type Count struct {
	SentPackets, SentBytes, ReceivedPackets, ReceivedBytes uint64
	SYNPackets, SYNBytes                                   uint64
}

// LostSYNs says whether a datapath count (the conntrack entry's, in a
// flow row) is this count but for k retransmitted SYNs (0 < k < SYNs),
// which the node's conntrack never counted: the first SYNs went under
// load before the entry that answered was confirmed. Everything else
// must be equal.
func (c Count) LostSYNs(sentPackets, sentBytes, receivedPackets, receivedBytes uint64) (k uint64, ok bool) {
	if receivedPackets != c.ReceivedPackets || receivedBytes != c.ReceivedBytes || sentPackets > c.SentPackets || c.SYNPackets == 0 {
		return 0, false
	}
	k = c.SentPackets - sentPackets
	return k, k < c.SYNPackets && sentBytes == c.SentBytes-k*(c.SYNBytes/c.SYNPackets)
}

// Read returns the counters.
func (pc *PodCounter) Read(ctx context.Context) (Count, error) {
	out, err := pc.nft(ctx, "", "-j", "list", "counters", "table", "inet", "dualflow_count")
	if err != nil {
		return Count{}, err
	}
	var doc struct {
		Nftables []struct {
			Counter *struct {
				Name           string `json:"name"`
				Packets, Bytes uint64
			} `json:"counter"`
		} `json:"nftables"`
	}
	if err := json.Unmarshal(out, &doc); err != nil {
		return Count{}, fmt.Errorf("nft -j: %w", err)
	}
	var c Count
	for _, o := range doc.Nftables {
		switch {
		case o.Counter == nil:
		case o.Counter.Name == "sent":
			c.SentPackets, c.SentBytes = o.Counter.Packets, o.Counter.Bytes
		case o.Counter.Name == "syn":
			c.SYNPackets, c.SYNBytes = o.Counter.Packets, o.Counter.Bytes
		case o.Counter.Name == "received":
			c.ReceivedPackets, c.ReceivedBytes = o.Counter.Packets, o.Counter.Bytes
		}
	}
	return c, nil
}

// WaitClosed waits until the pod's TCP connection from local port port
// has finished closing (TIME_WAIT, or gone): its last packet is counted.
func (pc *PodCounter) WaitClosed(ctx context.Context, port uint16) error {
	return poll(ctx, 30*time.Second, func() (bool, error) {
		out, err := exec.CommandContext(ctx, "nsenter", "--net="+pc.netns, "--", "ss", "-Htan",
			fmt.Sprintf("( sport = :%d )", port)).Output()
		if err != nil {
			return false, nil
		}
		for line := range strings.Lines(string(out)) {
			if f := strings.Fields(line); len(f) > 0 && f[0] != "TIME-WAIT" {
				return false, nil
			}
		}
		return true, nil
	})
}

// ServiceIPs returns a Service's cluster IPs.
func (c *Cluster) ServiceIPs(ctx context.Context, ns, name string) ([]netip.Addr, error) {
	s, err := c.API.Admin.CoreV1().Services(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	var out []netip.Addr
	for _, ip := range s.Spec.ClusterIPs {
		if a, err := netip.ParseAddr(ip); err == nil {
			out = append(out, a)
		}
	}
	return out, nil
}
