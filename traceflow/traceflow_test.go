package traceflow

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dualflow/dualflow/flow"
	"github.com/dualflow/dualflow/traceflow/packet"
	"github.com/dualflow/dualflow/traceflow/probes"
	"github.com/dualflow/dualflow/traceflow/ratelimit"
)

// fakeResolver resolves every request to fixed addresses; noV6 makes the
// IPv6 family fail with ErrNoAddress.
type fakeResolver struct {
	noV6 bool
	err  error
}

func (f fakeResolver) Resolve(req Request, fam Family) (Probe, error) {
	if f.err != nil {
		return Probe{}, f.err
	}
	if fam == IPv6 {
		if f.noV6 {
			return Probe{}, fmt.Errorf("%w: service backend/api-single has no IPv6 ClusterIP", ErrNoAddress)
		}
		return Probe{SourcePod: req.Source, Src: netip.MustParseAddr("fd00:10:0:1::10"), Dst: netip.MustParseAddr("fd00:10:ff::11"), DstPort: req.Destination.Port}, nil
	}
	return Probe{SourcePod: req.Source, Src: netip.MustParseAddr("198.18.1.10"), Dst: netip.MustParseAddr("198.19.0.11"), DstPort: req.Destination.Port}, nil
}

// WorkloadPod picks pod name-0 of every workload but "x/gone".
func (f fakeResolver) WorkloadPod(ref string) (string, bool, error) {
	return ref + "-0", ref != "x/gone", nil
}

// fakeTracer answers with trace(p), or blocks until ctx ends when trace is nil.
type fakeTracer struct {
	trace func(p Probe) (Path, error)
	mu    sync.Mutex
	seen  []Probe
}

func (f *fakeTracer) Trace(ctx context.Context, p Probe) (Path, error) {
	f.mu.Lock()
	f.seen = append(f.seen, p)
	f.mu.Unlock()
	if f.trace == nil {
		<-ctx.Done()
		return Path{}, ctx.Err()
	}
	return f.trace(p)
}

func delivered(p Probe) (Path, error) {
	return Path{Outcome: Delivered, Observations: []Observation{
		{Node: "node-1", Component: Forwarding, Action: ActionReceived, Interface: "veth1"},
		{Node: "node-2", Component: Delivery, Action: ActionDelivered, Interface: "eth0", Pod: "backend/api-1"},
	}}, nil
}

func req() Request {
	return Request{Source: "frontend/web-1", Destination: Destination{Service: "backend/api", Port: 80}}
}

func TestControllerDual(t *testing.T) {
	tr := &fakeTracer{trace: delivered}
	c := New(Config{}, tr, fakeResolver{}, nil)
	defer c.Close()
	res, err := c.Trace(context.Background(), req())
	if err != nil {
		t.Fatal(err)
	}
	if res.Phase != Succeeded || len(res.Families) != 2 {
		t.Fatalf("result %+v", res)
	}
	tags := map[uint8]bool{}
	for _, p := range tr.seen {
		tags[p.Tag] = true
		if p.Protocol != TCP || p.TCPFlags != packet.SYN || p.SrcPort < 32768 {
			t.Errorf("probe %+v: want a TCP SYN from an ephemeral port", p)
		}
	}
	if len(tags) != 2 {
		t.Errorf("families shared a tag: %v", tags)
	}
	for i, f := range []Family{IPv4, IPv6} {
		fr := res.Families[i]
		if fr.Family != f || fr.Outcome != Delivered || len(fr.Observations) != 2 || fr.Src.Is4() != (f == IPv4) {
			t.Errorf("family %d: %+v", i, fr)
		}
	}
	got, err := c.Get(context.Background(), res.ID)
	if err != nil || got.Phase != Succeeded {
		t.Errorf("Get: %v %v", got.Phase, err)
	}
	if _, err := c.Get(context.Background(), "tf-nope"); !errors.Is(err, ErrNotFound) {
		t.Errorf("Get unknown: %v", err)
	}
	// Tags are released when traces end.
	c.mu.Lock()
	for tg, used := range c.tags {
		if used {
			t.Errorf("tag %d still in use", tg)
		}
	}
	c.mu.Unlock()
}

func TestControllerOutcomes(t *testing.T) {
	tests := []struct {
		name      string
		family    Family
		res       fakeResolver
		trace     func(Probe) (Path, error)
		timeout   time.Duration
		wantPhase Phase
		want      map[Family]Outcome
		reason    string
	}{
		{"single-family service, dual", Dual, fakeResolver{noV6: true}, delivered, 0, Succeeded,
			map[Family]Outcome{IPv4: Delivered, IPv6: NoAddress}, "service backend/api-single has no IPv6 ClusterIP"},
		{"ipv6 only, no address", IPv6, fakeResolver{noV6: true}, delivered, 0, Failed,
			map[Family]Outcome{IPv6: NoAddress}, "no IPv6 ClusterIP"},
		{"drop is an outcome", IPv6, fakeResolver{}, func(Probe) (Path, error) {
			return Path{Outcome: Dropped, Reason: "dropped by NetworkPolicy backend/default-deny-ingress"}, nil
		}, 0, Succeeded, map[Family]Outcome{IPv6: Dropped}, "default-deny-ingress"},
		{"timeout", IPv4, fakeResolver{}, nil, 30 * time.Millisecond, Failed,
			map[Family]Outcome{IPv4: TimedOut}, "no delivery or drop seen before the timeout (30ms)"},
		{"tracer error", Dual, fakeResolver{}, func(Probe) (Path, error) { return Path{}, errors.New("boom") }, 0, Failed,
			map[Family]Outcome{IPv4: Error, IPv6: Error}, "boom"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := New(Config{}, &fakeTracer{trace: tt.trace}, tt.res, nil)
			defer c.Close()
			r := req()
			r.Family, r.Timeout = tt.family, Duration(tt.timeout)
			res, err := c.Trace(context.Background(), r)
			if err != nil {
				t.Fatal(err)
			}
			if res.Phase != tt.wantPhase {
				t.Errorf("phase %s (%s), want %s", res.Phase, res.Reason, tt.wantPhase)
			}
			all := res.Reason
			for _, fr := range res.Families {
				if fr.Outcome != tt.want[fr.Family] {
					t.Errorf("%s: outcome %s, want %s", fr.Family, fr.Outcome, tt.want[fr.Family])
				}
				all += " " + fr.Reason
			}
			if !strings.Contains(all, tt.reason) {
				t.Errorf("reasons %q do not say %q", all, tt.reason)
			}
		})
	}
}

func TestControllerLive(t *testing.T) {
	tr := &fakeTracer{trace: func(p Probe) (Path, error) {
		if !p.Live || !p.DroppedOnly || p.SrcPort != 0 || p.TCPFlags != 0 {
			return Path{}, fmt.Errorf("probe %+v: want live, dropped only, any source port, no flags", p)
		}
		return Path{Outcome: Dropped, SrcPort: 41000}, nil
	}}
	c := New(Config{}, tr, fakeResolver{}, nil)
	defer c.Close()
	r := req()
	r.Family, r.LiveTraffic, r.DroppedOnly = IPv4, true, true
	res, err := c.Trace(context.Background(), r)
	if err != nil {
		t.Fatal(err)
	}
	if fr := res.Families[0]; fr.Outcome != Dropped || fr.SrcPort != 41000 {
		t.Errorf("live result %+v", fr)
	}
}

func TestControllerRejects(t *testing.T) {
	c := New(Config{MaxTimeout: time.Minute}, &fakeTracer{trace: delivered}, fakeResolver{}, nil)
	defer c.Close()
	tests := []struct {
		name string
		edit func(*Request)
		want error
	}{
		{"dropped only without live traffic", func(r *Request) { r.DroppedOnly = true }, ErrInvalid},
		{"bad family", func(r *Request) { r.Family = "ipv5" }, ErrInvalid},
		{"no source namespace", func(r *Request) { r.Source = "web" }, ErrInvalid},
		{"two destinations", func(r *Request) { r.Destination.Pod = "backend/api-1" }, ErrInvalid},
		{"no destination", func(r *Request) { r.Destination = Destination{} }, ErrInvalid},
		{"tcp without port", func(r *Request) { r.Destination.Port = 0 }, ErrInvalid},
		{"bad protocol", func(r *Request) { r.Protocol = "SCTP" }, ErrInvalid},
		{"flags on udp", func(r *Request) { r.Protocol, r.TCPFlags = UDP, 2 }, ErrInvalid},
		{"timeout too long", func(r *Request) { r.Timeout = Duration(time.Hour) }, ErrInvalid},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := req()
			tt.edit(&r)
			if _, err := c.Start(context.Background(), r); !errors.Is(err, tt.want) {
				t.Errorf("Start err = %v, want %v", err, tt.want)
			}
		})
	}
	// Workload ends: one pod picked for both families, kept in the
	// request; an unknown workload is refused naming its field.
	r := req()
	r.Source, r.SourceWorkload, r.Destination = "", "frontend/web", Destination{Workload: "backend/api", Port: 80}
	res, err := c.Trace(context.Background(), r)
	if err != nil || res.Request.Source != "frontend/web-0" || res.Request.SourceWorkload != "frontend/web" ||
		res.Request.Destination.Pod != "backend/api-0" || res.Request.Destination.Workload != "backend/api" || res.Phase != Succeeded {
		t.Errorf("workload trace: %v %+v", err, res)
	}
	for _, tt := range []struct {
		name, field string
		edit        func(*Request)
	}{
		{"unknown source workload", "source_workload", func(r *Request) { r.Source, r.SourceWorkload = "", "x/gone" }},
		{"unknown destination workload", "destination.workload", func(r *Request) { r.Destination = Destination{Workload: "x/gone", Port: 80} }},
		{"source and source workload", "source_workload", func(r *Request) { r.SourceWorkload = "frontend/web" }},
		{"pod and workload destination", "destination", func(r *Request) { r.Destination.Workload = "backend/api" }},
		{"udp without port", "destination.port", func(r *Request) { r.Protocol, r.Destination.Port = UDP, 0 }},
	} {
		r := req()
		tt.edit(&r)
		var fe *FieldError
		if _, err := c.Start(context.Background(), r); !errors.As(err, &fe) || fe.Field != tt.field || !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: %v, want an ErrInvalid about %s", tt.name, err, tt.field)
		}
	}
	// A resolver error (unknown pod) is returned by Start.
	c2 := New(Config{}, &fakeTracer{trace: delivered}, fakeResolver{err: fmt.Errorf("%w: pod x/y not found", ErrInvalid)}, nil)
	defer c2.Close()
	if _, err := c2.Start(context.Background(), req()); !errors.Is(err, ErrInvalid) {
		t.Errorf("unknown pod: %v", err)
	}
}

func TestControllerBusy(t *testing.T) {
	// Traces block until Close; no rate limit: this is the tags' bound.
	c := New(Config{Timeout: time.Minute, CallerLimit: ratelimit.Limit{Rate: -1}, NodeLimit: ratelimit.Limit{Rate: -1}}, &fakeTracer{}, fakeResolver{}, nil)
	n := 0
	for {
		_, err := c.Start(context.Background(), req())
		if errors.Is(err, ErrBusy) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		n++
		if n > packet.MaxTag {
			t.Fatal("no ErrBusy")
		}
	}
	if n != packet.MaxTag/2 {
		t.Errorf("%d dual traces started, want %d", n, packet.MaxTag/2)
	}
	c.Close() // cancels the blocked traces and waits for them
}

func TestParseDestination(t *testing.T) {
	tests := []struct {
		in   string
		want Destination
		err  bool
	}{
		{"svc:backend/api:80", Destination{Service: "backend/api", Port: 80}, false},
		{"service:backend/api-single:8080", Destination{Service: "backend/api-single", Port: 8080}, false},
		{"pod:backend/api-1:8080", Destination{Pod: "backend/api-1", Port: 8080}, false},
		{"backend/api-1:8080", Destination{Pod: "backend/api-1", Port: 8080}, false},
		{"backend/api-1", Destination{Pod: "backend/api-1"}, false},
		{"workload:backend/api:8080", Destination{Workload: "backend/api", Port: 8080}, false},
		{"workload:backend:8080", Destination{}, true},
		{"ip:198.18.2.11:8080", Destination{IP: netip.MustParseAddr("198.18.2.11"), Port: 8080}, false},
		{"ip:[fd00:10:0:2::11]:8080", Destination{IP: netip.MustParseAddr("fd00:10:0:2::11"), Port: 8080}, false},
		{"ip:fd00:10:0:2::11", Destination{IP: netip.MustParseAddr("fd00:10:0:2::11")}, false},
		{"fd00:10:0:2::11", Destination{IP: netip.MustParseAddr("fd00:10:0:2::11")}, false},
		{"ip:::ffff:198.18.2.11", Destination{IP: netip.MustParseAddr("198.18.2.11")}, false},
		{"svc:backend:80", Destination{}, true},
		{"svc:backend/api:http", Destination{}, true},
		{"svc:backend/api:0", Destination{}, true},
		{"ip:fd00:10::1:99999", Destination{}, true},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := ParseDestination(tt.in)
			if (err != nil) != tt.err || (!tt.err && got != tt.want) {
				t.Fatalf("ParseDestination(%q) = %+v, %v; want %+v (err %v)", tt.in, got, err, tt.want, tt.err)
			}
			if !tt.err {
				again, err := ParseDestination(got.String())
				if err != nil || again != got {
					t.Errorf("round trip %q: %+v %v", got.String(), again, err)
				}
			}
		})
	}
}

func TestRequestJSON(t *testing.T) {
	in := `{"source":"frontend/web-1","destination":{"ip":"fd00:10:0:2::11","port":8080},"protocol":"TCP","family":"dual","timeout":"1.5s"}`
	var r Request
	if err := json.Unmarshal([]byte(in), &r); err != nil {
		t.Fatal(err)
	}
	if r.Destination.IP != netip.MustParseAddr("fd00:10:0:2::11") || time.Duration(r.Timeout) != 1500*time.Millisecond {
		t.Errorf("decoded %+v", r)
	}
	if err := json.Unmarshal([]byte(`{"timeout":2}`), &r); err != nil || time.Duration(r.Timeout) != 2*time.Second {
		t.Errorf("timeout in seconds: %v %v", r.Timeout, err)
	}
	b, _ := json.Marshal(Request{Source: "a/b", Destination: Destination{Service: "c/d", Port: 80}})
	if strings.Contains(string(b), `"ip"`) {
		t.Errorf("zero IP marshalled: %s", b)
	}
}

// fakeStore is a resultStore with function fields.
type fakeStore struct {
	save func(Result) error
	load func(id string) (Result, error)
}

func (f fakeStore) Save(_ context.Context, r Result) error { return f.save(r) }

func (f fakeStore) Load(_ context.Context, id string) (Result, error) { return f.load(id) }

func TestControllerGetFromStore(t *testing.T) {
	saved := Result{ID: "tf-00000000000000aa", Phase: Succeeded}
	errDown := errors.New("clickhouse down")
	var loads []string
	s := fakeStore{
		save: func(Result) error { return nil },
		load: func(id string) (Result, error) {
			loads = append(loads, id)
			switch id {
			case saved.ID:
				return saved, nil
			case "tf-00000000000000bb":
				return Result{}, errDown
			}
			return Result{}, fmt.Errorf("%w: %q", ErrNotFound, id)
		},
	}
	c := New(Config{}, &fakeTracer{trace: delivered}, fakeResolver{}, s)
	defer c.Close()
	ctx := context.Background()
	res, err := c.Trace(ctx, req())
	if err != nil {
		t.Fatal(err)
	}
	if got, err := c.Get(ctx, res.ID); err != nil || got.Phase != Succeeded || len(loads) != 0 {
		t.Errorf("Get of a trace in memory: %v %v, store read %v", got.Phase, err, loads)
	}
	for _, get := range []func(context.Context, string) (Result, error){c.Get, c.Wait} {
		if got, err := get(ctx, saved.ID); err != nil || got.ID != saved.ID {
			t.Errorf("saved trace: %+v %v", got, err)
		}
		if _, err := get(ctx, "tf-00000000000000cc"); !errors.Is(err, ErrNotFound) {
			t.Errorf("unknown trace: %v", err)
		}
		if _, err := get(ctx, "tf-00000000000000bb"); !errors.Is(err, errDown) || errors.Is(err, ErrNotFound) {
			t.Errorf("store down: %v", err)
		}
	}
}

// TestControllerRemembersProbes: every probe a trace sends is in the
// probe registry before it is sent, under the trace's id, so the flow
// records the exporters report for it are marked (IPv4 and IPv6); a live
// trace sends none and adds none.
func TestControllerRemembersProbes(t *testing.T) {
	reg := probes.New(probes.Config{})
	var mu sync.Mutex
	marked := map[Family]string{}
	tr := &fakeTracer{trace: func(p Probe) (Path, error) {
		// The record the source node's exporter reports for the probe,
		// after DNAT to an endpoint.
		endpoint := netip.MustParseAddr("198.18.2.20")
		if p.Family == IPv6 {
			endpoint = netip.MustParseAddr("fd00:10:0:2::20")
		}
		recs := []flow.Record{{FlowStart: time.Now(), SrcAddr: p.Src, SrcPort: p.SrcPort, DstAddr: endpoint, DstPort: 8080,
			ServiceAddr: p.Dst, ServicePort: p.DstPort, Proto: p.ProtoNumber()}}
		reg.Mark(recs)
		mu.Lock()
		marked[p.Family] = recs[0].ProbeTraceID
		mu.Unlock()
		return delivered(p)
	}}
	c := New(Config{Probes: reg}, tr, fakeResolver{}, nil)
	defer c.Close()
	res, err := c.Trace(context.Background(), req())
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []Family{IPv4, IPv6} {
		if marked[f] != res.ID {
			t.Errorf("%s: the probe's record marked %q, want the trace %s", f, marked[f], res.ID)
		}
	}
	if reg.Len() != 2 {
		t.Errorf("%d probes remembered, want 2", reg.Len())
	}
	live := req()
	live.LiveTraffic, live.Timeout = true, Duration(10*time.Millisecond)
	if _, err := c.Trace(context.Background(), live); err != nil {
		t.Fatal(err)
	}
	if reg.Len() != 2 {
		t.Errorf("%d probes remembered after a live trace, want 2", reg.Len())
	}
}

// TestObservationLegacyKeys: an observation reads back from the keys it
// is written with and from the camelCase ones of earlier versions (stored
// traces, agents not yet upgraded), in both families.
func TestObservationLegacyKeys(t *testing.T) {
	for _, tc := range []struct{ src, dst string }{
		{"198.18.0.5:40000", "198.18.1.7:8080"},
		{"[fd00:10::5]:40000", "[fd00:10:1::7]:8080"},
	} {
		want := Observation{Node: "node-1", Component: "kube-proxy", Action: ActionForwarded,
			TranslatedSrc: netip.MustParseAddrPort(tc.src), TranslatedDst: netip.MustParseAddrPort(tc.dst)}
		b, err := json.Marshal(want)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(b), `"translated_dst"`) {
			t.Errorf("written as %s, want snake_case keys", b)
		}
		legacy := strings.NewReplacer(`"translated_src"`, `"translatedSrc"`, `"translated_dst"`, `"translatedDst"`).Replace(string(b))
		for _, in := range []string{string(b), legacy} {
			var got Observation
			if err := json.Unmarshal([]byte(in), &got); err != nil || got != want {
				t.Errorf("%s read as %+v, %v; want %+v", in, got, err, want)
			}
		}
	}
}
