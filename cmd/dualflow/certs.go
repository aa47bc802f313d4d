package main

import (
	"context"
	"fmt"
	"net"

	"github.com/dualflow/dualflow/internal/certs"
	"github.com/dualflow/dualflow/netaddr"
)

func runCerts(ctx context.Context, args []string) error {
	fs := newFlagSet("certs", "--out DIR [flags]", `Issue the TLS certificates of a deployment from a private CA, for clusters
without cert-manager (deploy/kubernetes has a cert-manager overlay):

  ca.pem, ca-key.pem              the CA (reused when DIR holds one: renewal)
  collector.pem, collector-key.pem  the collector's IPFIX TLS listener, named
                                  for its Service (--collector-service in
                                  --namespace) and --dns/--ip
  exporter.pem, exporter-key.pem  the exporters' client certificate (mutual TLS)
  agent.pem, agent-key.pem        the node agents' traceflow certificate, named
                                  --agent-name (the collector verifies it with
                                  --traceflow.server-name)
  controller.pem, controller-key.pem  the collector's client certificate for
                                  the agents (mutual TLS)

Keys are written 0600. Keep ca-key.pem out of the cluster. The command
prints the kubectl commands that store them as the Secrets the manifests
and the Helm chart mount (docs/deploy.md).`)
	var o certs.Options
	var ips netaddr.HostList
	fs.StringVar(&o.Dir, "out", "", "directory to write the PEM files to (created)")
	fs.StringVar(&o.Namespace, "namespace", certs.DefaultNamespace, "namespace of the collector's Service")
	fs.StringVar(&o.CollectorService, "collector-service", certs.DefaultCollectorService, "name of the collector's Service")
	fs.StringVar(&o.ClusterDomain, "cluster-domain", certs.DefaultClusterDomain, "the cluster's DNS domain")
	fs.Var((*netaddr.HostList)(&o.CollectorDNS), "dns", "more DNS `names` of the collector, comma-separated (e.g. a load balancer's)")
	fs.Var(&ips, "ip", "`addresses` of the collector to put in its certificate, comma-separated, both families")
	fs.StringVar(&o.AgentName, "agent-name", certs.DefaultAgentName, "name in the node agents' certificate")
	fs.DurationVar(&o.Validity, "validity", certs.DefaultValidity, "lifetime of the certificates (the CA lives 10 times longer)")
	fs.BoolVar(&o.Force, "force", false, "overwrite existing certificates (renewal under the same CA)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("certs: unexpected arguments %q", fs.Args())
	}
	if o.Dir == "" {
		return fmt.Errorf("certs: --out is required")
	}
	for _, s := range ips {
		ip := net.ParseIP(s)
		if ip == nil {
			return fmt.Errorf("certs: --ip %q is not an address", s)
		}
		o.CollectorIPs = append(o.CollectorIPs, ip)
	}
	out, err := certs.Issue(o)
	if err != nil {
		return err
	}
	ca := "created"
	if out.CAReused {
		ca = "reused"
	}
	fmt.Printf("wrote %d files to %s (CA %s)\n\nStore them as the Secrets the manifests mount:\n\n", len(out.Files), o.Dir, ca)
	d := o.Dir
	fmt.Printf("  kubectl -n %[1]s create secret generic dualflow-collector-tls --from-file=tls.crt=%[2]s/collector.pem --from-file=tls.key=%[2]s/collector-key.pem --from-file=ca.crt=%[2]s/ca.pem\n", o.Namespace, d)
	fmt.Printf("  kubectl -n %[1]s create secret generic dualflow-exporter-tls --from-file=tls.crt=%[2]s/exporter.pem --from-file=tls.key=%[2]s/exporter-key.pem --from-file=ca.crt=%[2]s/ca.pem\n", o.Namespace, d)
	fmt.Printf("  kubectl -n %[1]s create secret generic dualflow-agent-tls --from-file=tls.crt=%[2]s/agent.pem --from-file=tls.key=%[2]s/agent-key.pem --from-file=ca.crt=%[2]s/ca.pem\n", o.Namespace, d)
	fmt.Printf("  kubectl -n %[1]s create secret generic dualflow-controller-tls --from-file=tls.crt=%[2]s/controller.pem --from-file=tls.key=%[2]s/controller-key.pem --from-file=ca.crt=%[2]s/ca.pem\n", o.Namespace, d)
	return nil
}
