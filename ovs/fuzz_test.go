package ovs

import (
	"testing"
)

// The seed corpus is the captured testdata (one line per seed) plus the
// files under testdata/fuzz/. The parsers must never panic, and what they
// accept must be self-consistent.

func seedLines(f *testing.F, files ...string) {
	for _, name := range files {
		lines(readTestdata(f, name), func(l string) bool {
			f.Add(l)
			return true
		})
	}
}

func FuzzParseConntrackLine(f *testing.F) {
	seedLines(f, "conntrack-ipv4.txt", "conntrack-ipv6.txt", "conntrack-brief.txt")
	f.Fuzz(func(t *testing.T, line string) {
		var e Entry
		if err := ParseConntrackLine(line, &e); err != nil {
			return
		}
		if e.Orig.IPVersion() == 0 || e.Orig.IPVersion() != e.Reply.IPVersion() {
			t.Fatalf("accepted %q with families %d/%d", line, e.Orig.IPVersion(), e.Reply.IPVersion())
		}
	})
}

func FuzzParseFlowLine(f *testing.F) {
	seedLines(f, "flows-ipv4.txt", "flows-ipv6.txt")
	f.Fuzz(func(t *testing.T, line string) {
		var fl Flow
		if err := ParseFlowLine(line, &fl); err != nil {
			return
		}
		if fl.Duration < 0 {
			t.Fatalf("negative duration from %q", line)
		}
		if tu, ok := MatchTuple(fl.Match); ok && (tu.IPVersion() == 0 || tu.Src.BitLen() != tu.Dst.BitLen()) {
			t.Fatalf("tuple %+v from %q", tu, fl.Match)
		}
	})
}

func FuzzMonitor(f *testing.F) {
	for _, name := range []string{"monitor-ipv4.txt", "monitor-ipv6.txt"} {
		f.Add(readTestdata(f, name))
	}
	f.Fuzz(func(t *testing.T, out string) {
		var p MonitorParser
		lines(out, func(l string) bool {
			if pi, done, _ := p.Feed(l); done && pi.Tuple.IPVersion() == 0 {
				t.Fatalf("packet-in without addresses from %q", l)
			}
			return true
		})
	})
}
