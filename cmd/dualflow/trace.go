package main

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/dualflow/dualflow/traceflow"
)

// errFamilyMissing makes `dualflow trace` exit 1 when a requested family
// did not arrive at its destination.
var errFamilyMissing = errors.New("a requested family did not arrive")

func runTrace(ctx context.Context, args []string) error {
	fs := newFlagSet("trace", "-s ns/pod -d DEST [flags]",
		"Inject a probe at a pod and print its path per IP family, through a collector's REST API\n"+
			"(--server URL, an operator token): the collector resolves the names in its live\n"+
			"Kubernetes view and traces through the exporters' node agents. Without --server, the REST API\n"+
			"of the demo running on the lab of --state-dir.\n"+
			"SRC is a pod, ns/name (or pod:ns/name), or workload:ns/name (one of its pods, the same for both families).\n"+
			"DEST is pod:ns/name:PORT (or ns/name:PORT), workload:ns/name:PORT, svc:ns/name:PORT or ip:ADDR[:PORT] ([v6]:PORT).\n"+
			"Exit status: 0 when every requested family arrived at the destination, 1 otherwise (a family\n"+
			"dropped, rejected, without an address, timed out, or an error before or during the trace).\n"+
			"The text output fits 100 columns and ends with a line saying which families arrived.")
	var (
		src, dst, proto, family   string
		sport                     uint
		flags, ttl                uint
		timeout                   time.Duration
		asJSON, live, droppedOnly bool
		external                  bool
	)
	fs.StringVar(&src, "s", "", "source: pod namespace/name, or workload:namespace/name")
	fs.StringVar(&dst, "d", "", "destination (pod:ns/name:port, workload:ns/name:port, svc:ns/name:port, ip:addr:port)")
	fs.StringVar(&proto, "protocol", "TCP", "TCP, UDP, ICMP or ICMPv6")
	fs.StringVar(&family, "family", "dual", "ipv4 (4), ipv6 (6) or dual (0)")
	fs.UintVar(&sport, "src-port", 0, "source port or ICMP echo id (0: random)")
	fs.UintVar(&flags, "tcp-flags", 0, "TCP flags: 0x02 (SYN, the default) is the only probe a trace sends")
	fs.UintVar(&ttl, "ttl", 0, "TTL / hop limit, 32 to 255 (default 64)")
	fs.BoolVar(&external, "external", false, "allow an ip: destination outside the cluster (the collector must run with --traceflow.allow-external)")
	fs.DurationVar(&timeout, "timeout", 3*time.Second, "per-family timeout")
	fs.BoolVar(&asJSON, "json", false, "print the result as JSON")
	fs.BoolVar(&live, "live", false, "trace the next real connection instead of injecting a probe (kernel datapath)")
	fs.BoolVar(&droppedOnly, "dropped-only", false, "with --live: skip delivered connections, report the next dropped one")
	var srv serverFlags
	srv.bind(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if src == "" || dst == "" {
		fs.Usage()
		return errors.New("trace: -s and -d are required")
	}
	d, err := traceflow.ParseDestination(dst)
	if err != nil {
		return err
	}
	if sport > 0xffff || flags > 0xff || ttl > 0xff {
		return errors.New("trace: --src-port, --tcp-flags or --ttl out of range")
	}
	req := traceflow.Request{Destination: d, Protocol: parseProtocol(proto), Family: traceflow.Family(family),
		SrcPort: uint16(sport), TCPFlags: uint8(flags), TTL: uint8(ttl), Timeout: traceflow.Duration(timeout),
		LiveTraffic: live, DroppedOnly: droppedOnly, External: external}
	if w, ok := strings.CutPrefix(src, "workload:"); ok {
		req.SourceWorkload = w
	} else {
		req.Source = strings.TrimPrefix(src, "pod:")
	}

	res, err := traceThrough(ctx, req, &srv)
	if err != nil {
		return err
	}
	if !asJSON {
		printTrace(os.Stdout, res)
		if err := missingFamilies(res); err != nil {
			return reportedError{err} // printTrace's last line says so
		}
		return nil
	}
	if err := printJSON(res); err != nil {
		return err
	}
	return missingFamilies(res)
}

// missingFamilies returns an errFamilyMissing naming the requested
// families that did not arrive, nil when all did.
func missingFamilies(res traceflow.Result) error {
	var missing []string
	for _, fr := range res.Families {
		if !fr.Outcome.Arrived() {
			missing = append(missing, fmt.Sprintf("%s %s", familyName(fr.Family), fr.Outcome))
		}
	}
	switch {
	case len(res.Families) == 0:
		return fmt.Errorf("trace: %w: no family was traced", errFamilyMissing)
	case len(missing) > 0:
		return fmt.Errorf("trace: %w: %s", errFamilyMissing, strings.Join(missing, ", "))
	}
	return nil
}

// traceThrough runs req through a collector's REST API (--server: POST
// /api/v1/traceflows?wait=true, an operator token), by default the one of
// the demo running on the lab of --state-dir.
func traceThrough(ctx context.Context, req traceflow.Request, srv *serverFlags) (traceflow.Result, error) {
	if err := srv.useDemo(); err != nil {
		return traceflow.Result{}, fmt.Errorf("trace: no --server, and %w", err)
	}
	c, err := srv.client()
	if err != nil {
		return traceflow.Result{}, err
	}
	body, err := json.Marshal(req)
	if err != nil {
		return traceflow.Result{}, err
	}
	var res traceflow.Result
	err = c.do(ctx, http.MethodPost, "/traceflows", url.Values{"wait": {"true"}}, bytes.NewReader(body), &res)
	return res, err
}

// parseProtocol reads --protocol in any case; the controller refuses
// what is not a protocol.
func parseProtocol(s string) traceflow.Protocol {
	for _, p := range []traceflow.Protocol{traceflow.TCP, traceflow.UDP, traceflow.ICMP, traceflow.ICMPv6} {
		if strings.EqualFold(s, string(p)) {
			return p
		}
	}
	return traceflow.Protocol(s)
}

// traceWidth is the width of the human output of `dualflow trace`: a
// terminal's 100 columns. Long fields (names, reasons, details) go on
// their own indented lines and wrap there.
const traceWidth = 100

// printTrace prints a trace for a person: a header, then each family's
// probe and path (one step a line, its policy, rule, translation and
// detail on indented lines below it), its outcome and reason, and a last
// line saying which requested families arrived (and so the exit status). No line is wider than
// traceWidth.
func printTrace(w io.Writer, r traceflow.Result) {
	tw := &wrapWriter{w: w, width: traceWidth}
	tw.field("", "trace ", fmt.Sprintf("%s: %s, family %s", r.ID, r.Request.Protocol, cmp.Or(string(r.Request.Family), "dual")))
	if r.Request.SourceWorkload != "" {
		tw.field("  ", "from ", "workload:"+r.Request.SourceWorkload)
		if r.Request.Source != "" {
			tw.field("  ", "     pod ", r.Request.Source)
		}
	} else {
		tw.field("  ", "from ", r.Request.Source)
	}
	tw.field("  ", "to   ", r.Request.Destination.String())
	if r.Phase == traceflow.Failed && r.Reason != "" {
		tw.field("  ", "failed: ", r.Reason)
	}
	var arrived, missing []string
	for _, fr := range r.Families {
		name := familyName(fr.Family)
		probe := "(no probe sent)"
		if fr.Src.IsValid() {
			probe = netip.AddrPortFrom(fr.Src, fr.SrcPort).String() + " -> " + netip.AddrPortFrom(fr.Dst, fr.DstPort).String()
		}
		tw.line("")
		tw.field("", name+"  ", probe)
		for _, o := range fr.Observations {
			tw.field("  ", "", stepString(o))
			const sub = "      "
			if o.Service != "" {
				tw.field(sub, "svc    ", o.Service)
			}
			if o.Pod != "" {
				tw.field(sub, "pod    ", o.Pod)
			}
			if o.Policy != "" {
				tw.field(sub, "policy ", o.Policy)
			}
			if o.Rule != "" {
				tw.field(sub, "rule   ", o.Rule)
			}
			if o.TranslatedDst.IsValid() {
				tw.field(sub, "dst -> ", o.TranslatedDst.String())
			}
			if o.TranslatedSrc.IsValid() {
				tw.field(sub, "src -> ", o.TranslatedSrc.String())
			}
			if o.Detail != "" {
				tw.field(sub, "", o.Detail)
			}
		}
		tw.field("  ", "=> ", fmt.Sprintf("%s after %v", strings.ToUpper(string(fr.Outcome)), time.Duration(fr.Duration).Round(time.Millisecond)))
		if fr.Reason != "" {
			tw.field("      ", "", fr.Reason)
		}
		if fr.Outcome.Arrived() {
			arrived = append(arrived, name)
		} else {
			missing = append(missing, name+" "+string(fr.Outcome))
		}
	}
	tw.line("")
	switch {
	case len(r.Families) == 0:
		tw.field("", "", "no family was traced (exit status 1)")
	case len(missing) == 0:
		tw.field("", "", "arrived: "+strings.Join(arrived, ", ")+" (exit status 0)")
	default:
		tw.field("", "", "did not arrive: "+strings.Join(missing, ", ")+" (exit status 1)")
	}
}

// familyName is how the human output names a family.
func familyName(f traceflow.Family) string {
	switch f {
	case traceflow.IPv4:
		return "IPv4"
	case traceflow.IPv6:
		return "IPv6"
	}
	return string(f)
}

// stepString is the first line of one observation: where and what.
func stepString(o traceflow.Observation) string {
	s := fmt.Sprintf("%s %s %s", o.Node, o.Component, o.Action)
	if o.Interface != "" {
		s += " " + o.Interface
	}
	return s
}

// wrapWriter writes lines of at most width columns.
type wrapWriter struct {
	w     io.Writer
	width int
}

func (t *wrapWriter) line(s string) { fmt.Fprintln(t.w, s) }

// field writes indent+label+value, wrapping value at spaces onto lines
// indented under its start (and a word wider than a line at the width).
func (t *wrapWriter) field(indent, label, value string) {
	first := indent + label
	hang := indent + strings.Repeat(" ", utf8.RuneCountInString(label))
	if utf8.RuneCountInString(hang) > t.width/2 {
		hang = indent + "  "
	}
	cur, n := first, utf8.RuneCountInString(first)
	empty := true // nothing of value on cur yet
	for word := range strings.FieldsSeq(value) {
		wn := utf8.RuneCountInString(word)
		if !empty && n+1+wn > t.width {
			t.line(cur)
			cur, n, empty = hang, utf8.RuneCountInString(hang), true
		}
		if !empty {
			cur, n = cur+" ", n+1
		}
		for n+wn > t.width { // a word longer than the room left
			room := t.width - n
			rs := []rune(word)
			t.line(cur + string(rs[:room]))
			word, wn = string(rs[room:]), wn-room
			cur, n = hang, utf8.RuneCountInString(hang)
		}
		cur, n, empty = cur+word, n+wn, false
	}
	t.line(cur)
}
