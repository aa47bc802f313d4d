//go:build !linux

package node

import (
	"errors"
	"net"
)

func peerMAC(podNS, iface, nodeNS string) (net.HardwareAddr, error) {
	return nil, errors.New("traceflow node: network namespaces are a Linux feature")
}
