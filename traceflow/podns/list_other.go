//go:build !linux

package podns

import "errors"

func listAddrs(path string) ([]ifaceAddr, error) {
	return nil, errors.New("podns: network namespaces are a Linux feature")
}
