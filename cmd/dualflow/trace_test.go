package main

import (
	"testing"

	"github.com/dualflow/dualflow/traceflow"
)

func TestParseProtocol(t *testing.T) {
	for in, want := range map[string]traceflow.Protocol{
		"tcp": traceflow.TCP, "UDP": traceflow.UDP, "icmp": traceflow.ICMP,
		"icmpv6": traceflow.ICMPv6, "ICMPv6": traceflow.ICMPv6, "sctp": "sctp",
	} {
		if got := parseProtocol(in); got != want {
			t.Errorf("parseProtocol(%q) = %q, want %q", in, got, want)
		}
	}
}
