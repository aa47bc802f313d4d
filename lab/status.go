package lab

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/dualflow/dualflow/lab/manifest"
	"github.com/dualflow/dualflow/lab/topology"
)

// WriteStatus prints the nodes, pods and services of the lab, and whether
// each namespace exists.
func (l *Lab) WriteStatus(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	exists := func(path string) string {
		if _, err := os.Stat(path); err != nil {
			return "MISSING"
		}
		return "ok"
	}
	st := l.State()
	fmt.Fprintf(tw, "lab %s: mode %s, datapath %s, created %s, built in %v\n\n", st.Prefix, st.Mode, st.Datapath, st.Created.Format("2006-01-02 15:04:05Z"), st.BuildTime)
	fmt.Fprintln(tw, "NODE\tZONE\tINTERNAL IPS\tPOD CIDRS\tNETNS\t")
	for i := range l.Manifest.Nodes {
		n := &l.Manifest.Nodes[i]
		var ips []string
		for _, a := range n.Status.Addresses {
			if a.Type == "InternalIP" {
				ips = append(ips, a.Address)
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s (%s)\t\n", n.Name, n.Labels[manifest.LabelZone], strings.Join(ips, ","),
			strings.Join(n.Spec.PodCIDRs, ","), n.Annotations[manifest.AnnotationNetNS], exists(l.NodeNetNSPath(n.Name)))
	}
	fmt.Fprintln(tw, "\nPOD\tNODE\tPOD IPS\tPORTS\tNETNS\tAGENT\t")
	for i := range l.Manifest.Pods {
		p := &l.Manifest.Pods[i]
		var ips, ports []string
		for _, a := range manifest.PodAddrs(p) {
			ips = append(ips, a.String())
		}
		for _, cp := range manifest.Ports(p) {
			ports = append(ports, fmt.Sprintf("%s=%d/%s", cp.Name, cp.ContainerPort, cp.Protocol))
		}
		fmt.Fprintf(tw, "%s/%s\t%s\t%s\t%s\t%s (%s)\t%s\t\n", p.Namespace, p.Name, p.Spec.NodeName, strings.Join(ips, ","),
			strings.Join(ports, ","), p.Annotations[manifest.AnnotationNetNS], exists(l.PodNetNSPath(p)), l.agentStatus("pod-"+p.Namespace+"-"+p.Name))
	}
	fmt.Fprintln(tw, "\nSERVICE\tFAMILY POLICY\tCLUSTER IPS\tPORTS\t")
	for _, s := range l.Manifest.Services {
		var ports []string
		for _, sp := range s.Spec.Ports {
			ports = append(ports, fmt.Sprintf("%s=%d->%s/%s", sp.Name, sp.Port, sp.TargetPort.String(), sp.Protocol))
		}
		pol := ""
		if s.Spec.IPFamilyPolicy != nil {
			pol = string(*s.Spec.IPFamilyPolicy)
		}
		fmt.Fprintf(tw, "%s/%s\t%s\t%s\t%s\t\n", s.Namespace, s.Name, pol, strings.Join(s.Spec.ClusterIPs, ","), strings.Join(ports, ","))
	}
	fmt.Fprintf(tw, "\ntraffic generator: %s\n", l.agentStatus("traffic"))
	fmt.Fprintln(tw, "\nNETWORKPOLICY\t")
	for _, p := range l.Manifest.NetworkPolicies {
		fmt.Fprintf(tw, "%s/%s\t\n", p.Namespace, p.Name)
	}
	return tw.Flush()
}

// agentStatus reports the agent process recorded in run/<name>.pid:
// "pid N", "pid N (dead)", or "-" without a pid file (in-process agents).
func (l *Lab) agentStatus(name string) string {
	b, err := os.ReadFile(filepath.Join(l.cfg.StateDir, runDir, name+".pid"))
	if err != nil {
		return "-"
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return "bad pid file"
	}
	if !topology.Alive(pid) {
		return fmt.Sprintf("pid %d (dead)", pid)
	}
	return fmt.Sprintf("pid %d", pid)
}
