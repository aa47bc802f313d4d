//go:build linux

package lab

import (
	"context"
	"fmt"
	"net"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/dualflow/dualflow/lab/manifest"
	"github.com/dualflow/dualflow/lab/ovs"
	"github.com/dualflow/dualflow/lab/topology"
	"github.com/dualflow/dualflow/nsrun"
)

// ovsEnv reads the MACs of every pod's and node's eth0.
func (l *Lab) ovsEnv() (ovs.Env, error) {
	env := ovs.Env{PodMACs: map[string]net.HardwareAddr{}, NodeMACs: map[string]net.HardwareAddr{}}
	for i := range l.Manifest.Pods {
		p := &l.Manifest.Pods[i]
		mac, err := linkMAC(l.PodNetNSPath(p), "eth0")
		if err != nil {
			return env, fmt.Errorf("pod %s/%s: %w", p.Namespace, p.Name, err)
		}
		env.PodMACs[p.Annotations[manifest.AnnotationNetNS]] = mac
	}
	for i := range l.Manifest.Nodes {
		n := l.Manifest.Nodes[i].Name
		mac, err := linkMAC(l.NodeNetNSPath(n), "eth0")
		if err != nil {
			return env, fmt.Errorf("node %s: %w", n, err)
		}
		env.NodeMACs[n] = mac
	}
	return env, nil
}

func linkMAC(nsPath, name string) (net.HardwareAddr, error) {
	h, err := netns.GetFromPath(nsPath)
	if err != nil {
		return nil, fmt.Errorf("open netns: %w", err)
	}
	defer h.Close()
	nl, err := netlink.NewHandleAt(h)
	if err != nil {
		return nil, fmt.Errorf("netlink: %w", err)
	}
	defer nl.Close()
	link, err := nl.LinkByName(name)
	if err != nil {
		return nil, fmt.Errorf("link %s: %w", name, err)
	}
	return link.Attrs().HardwareAddr, nil
}

// podsTxOff turns TX checksum offload off on every pod's eth0.
func (l *Lab) podsTxOff(ctx context.Context) error {
	pods := l.Manifest.Pods
	return topology.Parallel(ctx, len(pods), func(i int) error {
		if _, err := nsrun.Output(ctx, l.PodNetNSPath(&pods[i]), nil, "ethtool", "-K", "eth0", "tx", "off"); err != nil {
			return fmt.Errorf("pod %s/%s: tx offload off: %w", pods[i].Namespace, pods[i].Name, err)
		}
		return nil
	})
}

// fenceNode loads fenceRuleset into node.
func (l *Lab) fenceNode(ctx context.Context, node string, ports []ovs.Port) error {
	nftBin, err := NFTPath()
	if err != nil {
		return err
	}
	if _, err := nsrun.Output(ctx, l.NodeNetNSPath(node), []byte(fenceRuleset(ports)), nftBin, "-f", "-"); err != nil {
		return fmt.Errorf("node %s: fence: %w", node, err)
	}
	return nil
}
