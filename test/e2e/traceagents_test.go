package e2e

import (
	"net"
	"net/http"
	"slices"
	"testing"

	"github.com/dualflow/dualflow/lab"
	labovs "github.com/dualflow/dualflow/lab/ovs"
	"github.com/dualflow/dualflow/lab/nft"
	"github.com/dualflow/dualflow/lab/tracer"
	"github.com/dualflow/dualflow/nsrun"
	"github.com/dualflow/dualflow/traceflow/agent"
	"github.com/dualflow/dualflow/traceflow/node"
	"github.com/dualflow/dualflow/traceflow/podns"
)

// agentDir is a static directory of node agents.
type agentDir map[string]*agent.Client

func (d agentDir) Agent(n string) (*agent.Client, error) {
	c, ok := d[n]
	if !ok {
		return nil, &agent.AgentError{Node: n, Call: "lookup", Err: net.UnknownNetworkError("no agent")}
	}
	return c, nil
}

func (d agentDir) Nodes() []string {
	var out []string
	for n := range d {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

// inventoryPolicies names isolating policies from the lab manifest.
type inventoryPolicies struct{ inv tracer.Inventory }

func (p inventoryPolicies) IsolatingPolicies(ns, pod, dir string) []string {
	return p.inv.IsolatingPolicies(ns, pod, nft.Direction(dir))
}

// startNodeAgents serves one traceflow agent per lab node over HTTP on
// loopback, each watching only its own node's namespace.
func startNodeAgents(t testing.TB, l *lab.Lab, token string) agentDir {
	t.Helper()
	nftBin, err := lab.NFTPath()
	if err != nil {
		t.Fatal(err)
	}
	dir := agentDir{}
	for _, n := range l.Manifest.Nodes {
		tr := &node.Tracer{Name: n.Name, NetNS: l.NodeNetNSPath(n.Name), NFT: nftBin, Pods: &podns.Finder{Dirs: []string{nsrun.Dir}}}
		dp := "kernel"
		if l.State().Datapath == lab.DatapathOVS {
			tr.OVS = &node.OVS{RunDir: l.OVSDir(n.Name), Bridge: labovs.Bridge, RulesFile: l.OVSRulesPath()}
			dp = "ovs"
		}
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		srv := &http.Server{Handler: agent.Handler(tr, agent.Info{Node: n.Name, Datapath: dp}, token, nil)}
		go srv.Serve(ln)
		t.Cleanup(func() { srv.Close() })
		dir[n.Name] = &agent.Client{Node: n.Name, URL: "http://" + ln.Addr().String(), Token: token}
	}
	return dir
}
