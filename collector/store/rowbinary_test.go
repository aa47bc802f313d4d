package store

import (
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"net/netip"
	"reflect"
	"testing"
	"time"

	"github.com/dualflow/dualflow/flow"
)

// DecodeFlowRow decodes one row of FlowColumns written by AppendFlowRow
// from b into rec and returns the rest of b: the tests' inverse of
// AppendFlowRow.
func DecodeFlowRow(b []byte, rec *flow.Record) ([]byte, error) {
	return decodeFlowRow(b, rec, len(FlowColumns))
}

// sampleRecord returns a fully populated record of the given family.
func sampleRecord(i int, v6 bool) flow.Record {
	src, dst, svc := netip.MustParseAddr("198.18.1.10"), netip.MustParseAddr("198.18.2.20"), netip.MustParseAddr("198.19.0.10")
	exp := netip.MustParseAddr("198.18.0.1")
	if v6 {
		src, dst, svc = netip.MustParseAddr("fd00:10:1::a"), netip.MustParseAddr("fd00:10:2::14"), netip.MustParseAddr("fd00:10:ff::a")
		exp = netip.MustParseAddr("fd00:10::1")
	}
	start := time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC).Add(time.Duration(i) * time.Millisecond)
	r := flow.Record{
		FlowStart: start, FlowEnd: start.Add(5 * time.Second), TimeReceived: start.Add(6 * time.Second),
		SrcAddr: src, DstAddr: dst, SrcPort: uint16(30000 + i%30000), DstPort: 8080, Proto: flow.ProtoTCP,
		ServiceAddr: svc, ServicePort: 80,
		Packets: 12, Bytes: 1500, ReversePackets: 10, ReverseBytes: 9000,
		PacketsDelta: 2, BytesDelta: 150, ReversePacketsDelta: 1, ReverseBytesDelta: 900,
		EndReason: flow.EndReasonActiveTimeout, TCPState: "ESTABLISHED", Zone: 7, Mark: 0x42,
		ExporterAddr: exp, ObservationDomainID: 1, ExporterNode: "node-1", Source: "conntrack",
		Src: flow.Endpoint{PodNamespace: "shop", PodName: fmt.Sprintf("frontend-7d9f-%d", i%50), WorkloadKind: "Deployment", WorkloadName: "frontend",
			NodeName: "node-1", Zone: "zone-a", Labels: map[string]string{"app": "frontend", "tier": "web", "version": "v2"}},
		Dst: flow.Endpoint{PodNamespace: "shop", PodName: "cart-0", WorkloadKind: "StatefulSet", WorkloadName: "cart", NodeName: "node-2", Zone: "zone-b",
			Labels: map[string]string{"app": "cart"}},
		Service:     flow.Service{Namespace: "shop", Name: "cart", PortName: "http"},
		Type:        flow.FlowTypeInterNode,
		Correlation: flow.CorrelationMerged,
		Ingress:     flow.Policy{Namespace: "shop", Name: "cart-allow-frontend", Rule: 0, Verdict: flow.VerdictAllowed},
		Egress:      flow.Policy{Rule: -1, Verdict: flow.VerdictNotIsolated},
		// Both values of the flag, one per family.
		K8sViewStale: v6,
	}

	r.Normalize()
	return r
}

func TestFlowRowRoundTrip(t *testing.T) {
	tests := []struct {
		name string
		rec  flow.Record
	}{
		{"ipv4", sampleRecord(1, false)},
		{"ipv6", sampleRecord(2, true)},
		{"ipv4 mapped in ipv6 unmapped at normalize", func() flow.Record {
			r := sampleRecord(3, false)
			r.SrcAddr = netip.MustParseAddr("::ffff:198.18.1.10")
			r.Normalize()
			return r
		}()},
		{"zero values", flow.Record{Ingress: flow.Policy{Rule: -1}, Egress: flow.Policy{Rule: -1}}},
		{"ipv4 traceflow probe", func() flow.Record {
			r := sampleRecord(5, false)
			r.ProbeTraceID = "tf-fedcba9876543210"
			return r
		}()},
		{"ipv6 traceflow probe", func() flow.Record {
			r := sampleRecord(6, true)
			r.ProbeTraceID = "tf-0123456789abcdef"
			return r
		}()},
		{"denied with reported verdict", func() flow.Record {
			r := sampleRecord(4, true)
			r.Ingress = flow.Policy{Namespace: "shop", Name: "deny", Rule: -1, Verdict: flow.VerdictDenied, ReportedVerdict: flow.VerdictAllowed, ReportedName: "shop/x"}
			return r
		}()},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := AppendFlowRow(nil, &tt.rec)
			var got flow.Record
			rest, err := DecodeFlowRow(b, &got)
			if err != nil {
				t.Fatalf("decode: %v", err)
			}
			if len(rest) != 0 {
				t.Fatalf("%d bytes left over", len(rest))
			}
			want := tt.rec
			if want.IPVersion == 0 {
				want.IPVersion = flow.Version(want.SrcAddr)
			}
			if !reflect.DeepEqual(normTimes(want), normTimes(got)) {
				t.Fatalf("round trip mismatch:\nwant %+v\n got %+v", want, got)
			}
		})
	}
}

func normTimes(r flow.Record) flow.Record {
	for _, t := range []*time.Time{&r.FlowStart, &r.FlowEnd, &r.TimeReceived} {
		if !t.IsZero() {
			*t = t.UTC()
		}
	}
	return r
}

func TestDecodeTruncated(t *testing.T) {
	r := sampleRecord(1, true)
	b := AppendFlowRow(nil, &r)
	for n := 0; n < len(b); n++ {
		var got flow.Record
		if _, err := DecodeFlowRow(b[:n], &got); err == nil {
			t.Fatalf("decode of %d/%d bytes succeeded", n, len(b))
		}
	}
}

func FuzzDecodeFlowRow(f *testing.F) {
	for i, v6 := range []bool{false, true} {
		r := sampleRecord(i, v6)
		f.Add(AppendFlowRow(nil, &r))
	}
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		var rec flow.Record
		rest, err := DecodeFlowRow(b, &rec)
		if err != nil {
			return
		}
		if len(rest) > len(b) {
			t.Fatalf("rest longer than input")
		}
		// A decoded row must re-encode to the bytes it was decoded from,
		// except for label order and the derived verdict_mismatch byte.
		_ = AppendFlowRow(nil, &rec)
	})
}

func BenchmarkAppendFlowRow(b *testing.B) {
	recs := []flow.Record{sampleRecord(1, false), sampleRecord(2, true)}
	buf := make([]byte, 0, 64<<10)
	b.ReportAllocs()
	var total int
	for i := 0; i < b.N; i++ {
		if len(buf) > 60<<10 {
			buf = buf[:0]
		}
		n := len(buf)
		buf = AppendFlowRow(buf, &recs[i&1])
		total += len(buf) - n
	}
	b.ReportMetric(float64(total)/float64(b.N), "bytes/row")
}

func TestMarkTemporary(t *testing.T) {
	base := errors.New("Code: 241. DB::Exception: memory limit exceeded")
	if err := markTemporary(241, base); !errors.Is(err, ErrUnavailable) || !errors.Is(err, base) {
		t.Errorf("241 not marked temporary: %v", err)
	}
	// A cancelled insert (KILL QUERY) is retried with its dedup token, not
	// dropped after the reject limit.
	if err := markTemporary(394, base); !errors.Is(err, ErrUnavailable) {
		t.Errorf("394 QUERY_WAS_CANCELLED: %v, want retryable", err)
	}
	if err := markTemporary(62, base); errors.Is(err, ErrUnavailable) {
		t.Errorf("62 (syntax error) marked temporary")
	}
	if markTemporary(241, nil) != nil {
		t.Error("nil error marked")
	}
	for _, code := range []int{159, 202, 209, 210, 241, 242, 252, 285, 319, 394, 999} {
		if err := markTemporary(code, base); !errors.Is(err, ErrUnavailable) || Forbidden(err) {
			t.Errorf("code %d: %v, want temporary", code, err)
		}
	}
	for _, code := range []int{164, 497} { // READONLY, ACCESS_DENIED
		if err := markTemporary(code, base); errors.Is(err, ErrUnavailable) || !Forbidden(err) {
			t.Errorf("code %d: %v, want forbidden", code, err)
		}
	}
}

// TestLabelsEncodeInKeyOrder: equal label sets encode to equal bytes, in
// key order, whatever order the map iterates in, with and without the
// writer's cache.
func TestLabelsEncodeInKeyOrder(t *testing.T) {
	wantKeys, wantVals := []byte{1, 'a', 1, 'b', 1, 'c'}, []byte{1, '1', 1, '2', 0}
	var lc labelCache
	for i := range 50 {
		m := map[string]string{}
		for _, k := range rand.Perm(3) {
			m[string(rune('a'+k))] = [...]string{"1", "2", ""}[k]
		}
		if keys, vals := appendLabelColumns(nil, nil, m); string(keys) != string(wantKeys) || string(vals) != string(wantVals) {
			t.Fatalf("appendLabelColumns(%v) = %q %q, want %q %q", m, keys, vals, wantKeys, wantVals)
		}
		if keys, vals := lc.columns(m); string(keys) != string(wantKeys) || string(vals) != string(wantVals) {
			t.Fatalf("cached encoding of map %d = %q %q, want %q %q", i, keys, vals, wantKeys, wantVals)
		}
	}
	r1, r2 := sampleRecord(1, true), sampleRecord(1, true)
	r2.Src.Labels = maps.Clone(r1.Src.Labels)
	if string(AppendFlowRow(nil, &r1)) != string(AppendFlowRow(nil, &r2)) {
		t.Error("equal records encode to different rows")
	}
}

// TestLabelCache: through a cache smaller than the number of maps (slots
// are shared and evicted), every encoding equals the uncached one, and a
// map that grew is encoded again.
func TestLabelCache(t *testing.T) {
	sets := make([]map[string]string, 3000)
	for i := range sets {
		sets[i] = map[string]string{"app": fmt.Sprint("app-", i), "tier": fmt.Sprint(i % 7)}
	}
	var lc labelCache
	check := func(what string, m map[string]string) {
		t.Helper()
		keys, vals := lc.columns(m)
		wk, wv := appendLabelColumns(nil, nil, m)
		if string(keys) != string(wk) || string(vals) != string(wv) {
			t.Fatalf("%s: cached columns %q %q, want %q %q", what, keys, vals, wk, wv)
		}
	}
	for range 3 {
		for _, i := range rand.Perm(len(sets)) {
			check(fmt.Sprint("set ", i), sets[i])
		}
	}
	m := sets[0]
	check("set 0", m)
	m["zone"] = "a" // breaks flow.Endpoint's rule; the length guard notices
	check("grown map", m)
	m["rack"] = "r1"
	check("grown again", m)
}
