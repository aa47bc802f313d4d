package main

import (
	"bufio"
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// errNotListening: no socket listens on the address.
var errNotListening = errors.New("nothing listens there")

// listenerOf checks that the TCP socket listening on ap (or on the
// wildcard address of its family) belongs to process pid (0: none may),
// from /proc/net/tcp{,6} and the process's descriptors: a local user who
// bound the port while the collector was down is not the collector.
func listenerOf(ap netip.AddrPort, pid int) error {
	inodes, err := listeningInodes(ap)
	if err != nil {
		return err
	}
	if len(inodes) == 0 {
		return errNotListening
	}
	if pid > 0 {
		fds, err := os.ReadDir(filepath.Join("/proc", strconv.Itoa(pid), "fd"))
		if err != nil {
			return fmt.Errorf("cannot tell which process listens on %s (%w)", ap, err)
		}
		for _, fd := range fds {
			link, err := os.Readlink(filepath.Join("/proc", strconv.Itoa(pid), "fd", fd.Name()))
			if err != nil || !strings.HasPrefix(link, "socket:[") {
				continue
			}
			if inodes[strings.TrimSuffix(strings.TrimPrefix(link, "socket:["), "]")] {
				return nil
			}
		}
		return fmt.Errorf("the process listening on %s is not the collector that holds the data directory (PID %d)", ap, pid)
	}
	return fmt.Errorf("a process listens on %s, but none holds the data directory: it is not its collector", ap)
}

// listeningInodes returns the inodes of the TCP sockets in LISTEN state
// bound to ap's address and port, or to the wildcard of either family
// (an IPv6 wildcard accepts IPv4 too).
func listeningInodes(ap netip.AddrPort) (map[string]bool, error) {
	out := map[string]bool{}
	for _, file := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		f, err := os.Open(file)
		if err != nil {
			if errors.Is(err, os.ErrNotExist) {
				continue
			}
			return nil, err
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			fields := strings.Fields(sc.Text())
			if len(fields) < 10 || fields[3] != "0A" { // TCP_LISTEN
				continue
			}
			local, ok := parseProcAddr(fields[1])
			if !ok || local.Port() != ap.Port() {
				continue
			}
			a := local.Addr().Unmap()
			if a == ap.Addr().Unmap() || a.IsUnspecified() {
				out[fields[9]] = true
			}
		}
		f.Close()
	}
	return out, nil
}

// parseProcAddr reads "0100007F:1F90" (IPv4) or the 32-hex-digit IPv6
// form of /proc/net/tcp6: each 32-bit word in host (little-endian) order.
func parseProcAddr(s string) (netip.AddrPort, bool) {
	h, p, ok := strings.Cut(s, ":")
	if !ok {
		return netip.AddrPort{}, false
	}
	port, err := strconv.ParseUint(p, 16, 16)
	if err != nil {
		return netip.AddrPort{}, false
	}
	b, err := hex.DecodeString(h)
	if err != nil || (len(b) != 4 && len(b) != 16) {
		return netip.AddrPort{}, false
	}
	for i := 0; i < len(b); i += 4 {
		b[i], b[i+1], b[i+2], b[i+3] = b[i+3], b[i+2], b[i+1], b[i]
	}
	a, _ := netip.AddrFromSlice(b)
	return netip.AddrPortFrom(a, uint16(port)), true
}
