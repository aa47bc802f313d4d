//go:build !linux

package node

import (
	"errors"
	"net"
)

type peer struct {
	Name string
	MAC  net.HardwareAddr
}

func peerOf(podNS, iface, nodeNS string) (peer, error) {
	return peer{}, errors.New("traceflow node: network namespaces are a Linux feature")
}
