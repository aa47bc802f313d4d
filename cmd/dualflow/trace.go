package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/dualflow/dualflow/lab/labcmd"
	"github.com/dualflow/dualflow/traceflow"
)

// errFamilyMissing makes `dualflow trace` exit non-zero when a requested
// family did not arrive at its destination.
var errFamilyMissing = errors.New("a requested family did not arrive")

func runTrace(ctx context.Context, args []string) error {
	fs := newFlagSet("trace", "-s ns/pod -d DEST [flags]",
		"Inject a probe at a pod and print its path per IP family, side by side, through a collector's\n"+
			"REST API (--server URL, an operator token): the collector resolves the names in its live\n"+
			"Kubernetes view and traces through the exporters' node agents. Without --server, the REST API\n"+
			"of the demo running on the lab of --state-dir.\n"+
			"SRC is a pod, ns/name (or pod:ns/name), or workload:ns/name (one of its pods, the same for both families).\n"+
			"DEST is pod:ns/name:PORT (or ns/name:PORT), workload:ns/name:PORT, svc:ns/name:PORT or ip:ADDR[:PORT] ([v6]:PORT).\n"+
			"Exits non-zero when a requested family does not arrive (dropped, no address, timeout).")
	var (
		src, dst, proto, family, stateDir string
		sport                             uint
		flags, ttl                        uint
		timeout                           time.Duration
		asJSON, live, droppedOnly         bool
		external                          bool
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
	fs.StringVar(&stateDir, "state-dir", labcmd.DefaultStateDir, "without --server: the state directory of a running demo, whose REST API is used")
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

	res, err := traceThrough(ctx, req, &srv, stateDir)
	if err != nil {
		return err
	}
	if asJSON {
		if err := printJSON(res); err != nil {
			return err
		}
	} else {
		printTrace(os.Stdout, res)
	}
	for _, fr := range res.Families {
		if !fr.Outcome.Arrived() {
			return fmt.Errorf("%w: %s %s", errFamilyMissing, fr.Family, fr.Outcome)
		}
	}
	return nil
}

// traceThrough runs req through a collector's REST API (--server: POST
// /api/v1/traceflows?wait=true, an operator token), by default the one of
// the demo running on the lab of stateDir.
func traceThrough(ctx context.Context, req traceflow.Request, srv *serverFlags, stateDir string) (traceflow.Result, error) {
	if srv.url == "" {
		u, err := labcmd.DemoWebURL(stateDir)
		if err != nil {
			return traceflow.Result{}, fmt.Errorf("trace: no --server, and %w", err)
		}
		srv.url = u
		srv.localTokenFile = labcmd.DemoTokenFile(stateDir)
	} else if u, err := labcmd.DemoWebURL(stateDir); err == nil && strings.TrimSuffix(u, "/") == strings.TrimSuffix(srv.url, "/") {
		// --server is the demo's: its operator token is known too.
		srv.localTokenFile = labcmd.DemoTokenFile(stateDir)
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

// printTrace prints the families side by side: one column per family,
// one row per step.
func printTrace(w io.Writer, r traceflow.Result) {
	fmt.Fprintf(w, "traceflow %s: %s -> %s (%s, %s) %s", r.ID, r.Request.Source, r.Request.Destination, r.Request.Protocol, r.Request.Family, r.Phase)
	if r.Reason != "" {
		fmt.Fprintf(w, ": %s", r.Reason)
	}
	fmt.Fprintln(w)
	cols := make([][]string, len(r.Families))
	rows := 0
	for i, fr := range r.Families {
		col := []string{strings.ToUpper(string(fr.Family))}
		if fr.Src.IsValid() {
			col = append(col, fmt.Sprintf("%s:%d -> %s:%d", fr.Src, fr.SrcPort, fr.Dst, fr.DstPort))
		} else {
			col = append(col, "-")
		}
		for _, o := range fr.Observations {
			col = append(col, stepString(o))
		}
		out := strings.ToUpper(string(fr.Outcome))
		if fr.Reason != "" {
			out += ": " + fr.Reason
		}
		col = append(col, fmt.Sprintf("=> %s (%v)", out, time.Duration(fr.Duration).Round(time.Millisecond)))
		cols[i] = col
		rows = max(rows, len(col))
	}
	tw := tabwriter.NewWriter(w, 0, 0, 3, ' ', 0)
	for row := range rows {
		cells := make([]string, len(cols))
		for i, col := range cols {
			if row < len(col) {
				cells[i] = col[row]
			}
		}
		fmt.Fprintln(tw, strings.Join(cells, "\t")+"\t")
	}
	tw.Flush()
}

func stepString(o traceflow.Observation) string {
	s := fmt.Sprintf("%s %s %s", o.Node, o.Component, o.Action)
	if o.Interface != "" {
		s += " " + o.Interface
	}
	if o.Pod != "" {
		s += " pod " + o.Pod
	}
	if o.Service != "" {
		s += " svc " + o.Service
	}
	if o.Policy != "" || o.Rule != "" {
		s += fmt.Sprintf(" policy %s rule %s", o.Policy, o.Rule)
	}
	if o.TranslatedDst.IsValid() {
		s += " dst->" + o.TranslatedDst.String()
	}
	if o.TranslatedSrc.IsValid() {
		s += " src->" + o.TranslatedSrc.String()
	}
	return s
}
