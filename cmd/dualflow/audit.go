package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/dualflow/dualflow/collector/audit"
	"github.com/dualflow/dualflow/collector/enrich"
	"github.com/dualflow/dualflow/collector/store"
	"github.com/dualflow/dualflow/flow"
	"github.com/dualflow/dualflow/web/api"
)

const auditHelp = `Audit NetworkPolicies: which policy allowed or denied each flow, and where
dual-stack policy has gaps. Static subcommands read Kubernetes manifests
(kubectl get -A -o yaml output, the lab's manifest.yaml) and need no store;
the others query the flow store like 'dualflow sql' does (the collector's
ClickHouse HTTP interface, or the embedded data directory when no collector
runs, or --clickhouse.dsn).

Subcommands:
  findings     unprotected workloads, dual-stack gaps, invalid policies (--inventory; --observed adds recorded flows)
  unprotected  workloads that no policy isolates, per direction (--inventory)
  eval         what the policies do to one flow (--inventory --from ns/pod --to ns/pod|IP --port 80)
  denied       denied flows by policy rule, workloads, family, protocol and port (store)
  unused       policy rules that allowed no flow in a window (store + --inventory)
  whatif       recorded flows a proposed policy would newly deny or allow (store + --inventory + --policy)

With --server URL every subcommand asks a running collector instead (its
REST API, /api/v1/audit/...): the cluster is the collector's live
Kubernetes view, the flows its store; --inventory is then not needed.
Without --server, --inventory or a store flag (--url, --direct,
--clickhouse.*), a subcommand asks the demo running on the lab of
--state-dir (make run) the same way, as 'dualflow trace' does; without a
demo it works locally.

  dualflow audit findings --dual-stack           # the running demo's
  dualflow audit findings --server http://127.0.0.1:8080 --dual-stack
  dualflow audit findings --inventory /run/dualflow/lab/manifest.yaml
  dualflow audit eval --inventory m.yaml --from frontend/web-6b7f9c5d84-w6ntt --to 198.18.2.11 --port 9090
  dualflow audit denied --since 1h --family 6
  dualflow audit whatif --inventory m.yaml --policy allow-metrics-v6.yaml --since 6h`

func runAudit(ctx context.Context, args []string) error {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		fmt.Println("Usage: dualflow audit <findings|unprotected|eval|denied|unused|whatif> [flags]\n\n" + auditHelp)
		return nil
	}
	subs := map[string]func(context.Context, []string) error{"findings": runAuditFindings, "unprotected": runAuditUnprotected,
		"eval": runAuditEval, "denied": runAuditDenied, "unused": runAuditUnused, "whatif": runAuditWhatIf}
	if run, ok := subs[args[0]]; ok {
		return run(ctx, args[1:])
	}
	return fmt.Errorf("audit: unknown subcommand %q (want findings, unprotected, eval, denied, unused or whatif)", args[0])
}

// files is a repeatable file flag.
type files []string

func (f *files) String() string     { return strings.Join(*f, ",") }
func (f *files) Set(s string) error { *f = append(*f, s); return nil }

// auditFlags are the flags the subcommands share.
type auditFlags struct {
	inventory files
	json      bool
	since     string
	until     string
	store     store.Config
	url       string
	direct    bool
	timeout   time.Duration
	srv       serverFlags
	// local: --inventory or a store flag was given, so the command works
	// locally rather than asking a running demo.
	local bool
}

// parse parses args into fs and notes whether a flag asks for local work.
func (a *auditFlags) parse(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %v", fs.Args())
	}
	fs.Visit(func(f *flag.Flag) {
		switch {
		case f.Name == "inventory", f.Name == "url", f.Name == "direct", strings.HasPrefix(f.Name, "clickhouse."):
			a.local = true
		}
	})
	return nil
}

func (a *auditFlags) bindInventory(fs *flag.FlagSet) {
	fs.Var(&a.inventory, "inventory", "Kubernetes manifest file (YAML or JSON, multi-document, Lists accepted); repeat for several")
}

func (a *auditFlags) bindStore(fs *flag.FlagSet, since string) {
	a.store.BindFlags(fs)
	fs.StringVar(&a.url, "url", "http://"+store.DefaultHTTPAddr+"/", "ClickHouse HTTP interface to query (a running collector's embedded store, or a server)")
	fs.BoolVar(&a.direct, "direct", false, "open the embedded data directory directly, without trying HTTP")
	fs.StringVar(&a.since, "since", since, "start of the time window: a duration back from now (1h) or an RFC 3339 time")
	fs.StringVar(&a.until, "until", "", "end of the time window, RFC 3339 (default now)")
	fs.DurationVar(&a.timeout, "timeout", 5*time.Minute, "give up after this long")
}

func (a *auditFlags) bindOutput(fs *flag.FlagSet) {
	fs.BoolVar(&a.json, "json", false, "print JSON instead of text")
	a.srv.bind(fs)
}

// ask asks fn its question of the audit API of the collector named by
// --server, else, unless --inventory or a store flag asks for local work,
// of the demo running on the lab of --state-dir (as dualflow trace does),
// else of the same audit.Queries the collector serves, over the manifests
// of a's --inventory (read when a question needs them) and, with
// withStore, the flow store. The subcommands with a window (--since) get
// it, and all run under --timeout when they have one.
func ask[T any](ctx context.Context, a *auditFlags, opt audit.Options, withStore bool, fn func(api.Audit, context.Context, audit.Window) (T, error)) (T, error) {
	var zero T
	var win audit.Window
	if a.since != "" {
		var err error
		if win, err = a.window(); err != nil {
			return zero, err
		}
	}
	if a.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, a.timeout)
		defer cancel()
	}
	if a.srv.url != "" || !a.local {
		// Without --server and without a demo, the work is local.
		_ = a.srv.useDemo()
	}
	c, err := a.srv.client()
	switch {
	case err != nil:
		return zero, err
	case c != nil:
		return fn(remoteAudit{c}, ctx, win)
	}
	local := &audit.Queries{Cluster: a.loadInventory, Options: opt}
	if withStore {
		r, closeStore, err := a.reports()
		if err != nil {
			return zero, err
		}
		defer closeStore()
		local.Reports = r
	}
	return fn(local, ctx, win)
}

func (a *auditFlags) loadInventory() (*enrich.Snapshot, error) {
	if len(a.inventory) == 0 {
		return nil, fmt.Errorf("--inventory is required when neither --server is given nor a demo runs on the lab of %s (a manifest file: kubectl get ns,pods,svc,rs,networkpolicies -A -o yaml > cluster.yaml)", a.srv.stateDir)
	}
	return enrich.LoadSnapshot(a.inventory...)
}

func (a *auditFlags) window() (audit.Window, error) {
	now := time.Now()
	since, err := audit.ParseSince(a.since, now)
	if err != nil {
		return audit.Window{}, fmt.Errorf("--since: %w", err)
	}
	w := audit.Window{Since: since, Until: now}
	if a.until != "" {
		if w.Until, err = time.Parse(time.RFC3339, a.until); err != nil {
			return w, fmt.Errorf("--until: %w", err)
		}
	}
	return w, nil
}

// reports returns the store reports and a function closing the store.
func (a *auditFlags) reports() (*audit.Reports, func(), error) {
	a.store.SetDefaults()
	if err := a.store.Validate(); err != nil {
		return nil, nil, err
	}
	// The reports are the product's own read-only SQL, which carries
	// settings (memory bounds) a reader may not send: they run as the
	// admin, on the collector that holds the data directory only.
	q := &cliQuerier{endpoint: a.url, cfg: a.store, direct: a.direct, write: true}
	r, err := audit.NewReports(q, a.store.Database)
	if err != nil {
		return nil, nil, err
	}
	return r, q.close, nil
}

// remoteAudit asks the audit API of a collector (/api/v1/audit/...).
type remoteAudit struct{ c *apiClient }

var _ api.Audit = remoteAudit{}

func windowValues(w audit.Window) url.Values {
	return url.Values{"since": {w.Since.Format(time.RFC3339Nano)}, "until": {w.Until.Format(time.RFC3339Nano)}}
}

func (r remoteAudit) Findings(ctx context.Context, w audit.Window) (*audit.FindingsResponse, error) {
	res := new(audit.FindingsResponse)
	return res, r.c.do(ctx, http.MethodGet, "/audit/findings", windowValues(w), nil, res)
}

func (r remoteAudit) Unprotected(ctx context.Context) ([]audit.UnprotectedWorkload, error) {
	var res []audit.UnprotectedWorkload
	return res, r.c.do(ctx, http.MethodGet, "/audit/unprotected", nil, nil, &res)
}

func (r remoteAudit) Denied(ctx context.Context, opt audit.DeniedOptions) ([]audit.DeniedGroup, error) {
	q := windowValues(opt.Window)
	q.Set("namespace", opt.Namespace)
	if opt.Family != 0 {
		q.Set("family", strconv.Itoa(int(opt.Family)))
	}
	q.Set("limit", strconv.Itoa(opt.Limit))
	var res []audit.DeniedGroup
	return res, r.c.do(ctx, http.MethodGet, "/audit/denied", q, nil, &res)
}

func (r remoteAudit) Unused(ctx context.Context, w audit.Window) (*audit.UnusedReport, error) {
	res := new(audit.UnusedReport)
	return res, r.c.do(ctx, http.MethodGet, "/audit/unused", windowValues(w), nil, res)
}

func (r remoteAudit) WhatIf(ctx context.Context, body io.Reader, w audit.Window, limit int) (*audit.WhatIfReport, error) {
	q := windowValues(w)
	q.Set("limit", strconv.Itoa(limit))
	res := new(audit.WhatIfReport)
	return res, r.c.do(ctx, http.MethodPost, "/audit/whatif", q, body, res)
}

func (r remoteAudit) Evaluate(ctx context.Context, p audit.Probe) ([]audit.ProbeResult, error) {
	q := url.Values{"from": {p.From}, "to": {p.To}, "port": {strconv.Itoa(int(p.Port))}, "proto": {strconv.Itoa(int(p.Proto))}}
	if p.Family != 0 {
		q.Set("family", strconv.Itoa(int(p.Family)))
	}
	var res []audit.ProbeResult
	return res, r.c.do(ctx, http.MethodGet, "/audit/evaluate", q, nil, &res)
}

func printJSON(v any) error {
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func table(w io.Writer) *tabwriter.Writer { return tabwriter.NewWriter(w, 0, 4, 2, ' ', 0) }

// findingIndent is where a finding's message and fix begin, under
// FINDING: past the SEVERITY column.
const findingIndent = "          "

// printFindings prints each finding as a block no wider than traceWidth
// (as dualflow trace does): its severity in the SEVERITY column, then its
// kind and count with the count's unit, its message on the lines below,
// and the suggested fix on an indented line after it.
func printFindings(w io.Writer, fs []audit.Finding) {
	if len(fs) == 0 {
		fmt.Fprintln(w, "no findings")
		return
	}
	tw := &wrapWriter{w: w, width: traceWidth}
	tw.line(fmt.Sprintf("%-*s%s", len(findingIndent), "SEVERITY", "FINDING"))
	for _, f := range fs {
		head := f.Kind
		if f.Count > 0 {
			unit := f.Unit // plural (audit.Finding)
			if f.Count == 1 {
				unit = strings.TrimSuffix(unit, "s")
			}
			head += ", " + strings.TrimSpace(fmt.Sprintf("%d %s", f.Count, unit))
		}
		tw.field("", fmt.Sprintf("%-*s", len(findingIndent), f.Severity), head)
		tw.field(findingIndent, "", f.Message)
		if f.Fix != "" {
			tw.field(findingIndent+"  ", "fix: ", f.Fix)
		}
	}
}

func runAuditFindings(ctx context.Context, args []string) error {
	fs := newFlagSet("audit findings", "--inventory FILE | --server URL [flags]", `Static analysis of the manifests: invalid policies, workloads no policy
isolates, and dual-stack gaps (workload pairs allowed over one family and
denied over the other, ipBlocks covering one family of dual-stack pods,
single-stack Services in front of dual-stack pods). --observed adds the
gaps seen in the recorded flows of the window. With --server, the
collector's findings for its live cluster view, observed gaps included.
Each finding prints its severity (high, medium, low), kind and count,
its message, and a suggested fix, within 100 columns; --json gives the
same fields as GET /api/v1/audit/findings.`)
	var a auditFlags
	a.bindInventory(fs)
	a.bindOutput(fs)
	a.bindStore(fs, "1h")
	observed := fs.Bool("observed", false, "also analyse the recorded flows of the window (needs the store; always on with --server)")
	dualOnly := fs.Bool("dual-stack", false, "only the dual-stack findings")
	maxPairs := fs.Int("max-pairs", 0, "bound of the pod-class pairs evaluated for verdict gaps (0: default 250000)")
	if err := a.parse(fs, args); err != nil {
		return err
	}
	res, err := ask(ctx, &a, audit.Options{MaxPairs: *maxPairs}, *observed, api.Audit.Findings)
	switch {
	case err != nil:
		return err
	case res.ObservedError != "":
		return fmt.Errorf("observed findings: %s", res.ObservedError)
	}
	out := res.Findings
	if *dualOnly {
		out = slices.DeleteFunc(out, func(f audit.Finding) bool { return !f.DualStack() })
	}
	if a.json {
		return printJSON(append([]audit.Finding{}, out...))
	}
	printFindings(os.Stdout, out)
	return nil
}

func runAuditUnprotected(ctx context.Context, args []string) error {
	fs := newFlagSet("audit unprotected", "--inventory FILE | --server URL [--json]", "List the workloads with pods that no NetworkPolicy isolates, for ingress and for egress.")
	var a auditFlags
	a.bindInventory(fs)
	a.bindOutput(fs)
	if err := a.parse(fs, args); err != nil {
		return err
	}
	us, err := ask(ctx, &a, audit.Options{}, false, func(q api.Audit, ctx context.Context, _ audit.Window) ([]audit.UnprotectedWorkload, error) {
		return q.Unprotected(ctx)
	})
	if err != nil {
		return err
	}
	if a.json {
		return printJSON(append([]audit.UnprotectedWorkload{}, us...))
	}
	tw := table(os.Stdout)
	fmt.Fprintln(tw, "NAMESPACE\tWORKLOAD\tPODS\tNOT ISOLATED FOR INGRESS\tNOT ISOLATED FOR EGRESS")
	for _, u := range us {
		fmt.Fprintf(tw, "%s\t%s/%s\t%d\t%d\t%d\n", u.Namespace, u.Workload.Kind, u.Workload.Name, u.Pods, u.IngressPods, u.EgressPods)
	}
	return tw.Flush()
}

func runAuditEval(ctx context.Context, args []string) error {
	fs := newFlagSet("audit eval", "--inventory FILE | --server URL --from ns/pod|IP --to ns/pod|IP --port N [flags]",
		"Say what the policies of the manifests do to one flow, per family: the verdict of each side and the deciding policy and rule.")
	var a auditFlags
	a.bindInventory(fs)
	a.bindOutput(fs)
	from := fs.String("from", "", "source: namespace/pod or an IP address")
	to := fs.String("to", "", "destination (after DNAT): namespace/pod or an IP address")
	port := fs.Uint("port", 0, "destination port")
	proto := fs.String("proto", "tcp", "tcp, udp, sctp, icmp, icmpv6 or a protocol number")
	family := fs.String("family", "", "4 or 6 (default: every family both ends have)")
	if err := a.parse(fs, args); err != nil {
		return err
	}
	if *port > 65535 {
		return fmt.Errorf("--port %d out of range", *port)
	}
	p, err := audit.ParseProto(*proto)
	if err != nil {
		return err
	}
	fam, err := flow.ParseFamily(*family)
	if err != nil {
		return err
	}
	res, err := ask(ctx, &a, audit.Options{}, false, func(q api.Audit, ctx context.Context, _ audit.Window) ([]audit.ProbeResult, error) {
		return q.Evaluate(ctx, audit.Probe{From: *from, To: *to, Proto: p, Port: uint16(*port), Family: fam})
	})
	if err != nil {
		return err
	}
	if a.json {
		return printJSON(res)
	}
	for _, r := range res {
		fmt.Println(r.Message)
	}
	return nil
}

func runAuditDenied(ctx context.Context, args []string) error {
	fs := newFlagSet("audit denied", "[flags]", "Denied flows of the window grouped by direction, policy and rule, source and destination workload, family,\nprotocol and destination port. RULE is blank for a denial (no rule allows), REPORTED when no exporter\nreported a verdict, PROTO and PORT for flows summed before the rollup kept them (schema migration 0013);\nan ICMP or ICMPv6 PORT is TYPE.CODE.")
	var a auditFlags
	a.bindOutput(fs)
	a.bindStore(fs, "1h")
	ns := fs.String("namespace", "", "only flows from or to this namespace")
	family := fs.String("family", "", "only IPv4 (4) or IPv6 (6)")
	limit := fs.Int("limit", 1000, "at most this many groups")
	if err := a.parse(fs, args); err != nil {
		return err
	}
	fam, err := flow.ParseFamily(*family)
	if err != nil {
		return err
	}
	gs, err := ask(ctx, &a, audit.Options{}, true, func(q api.Audit, ctx context.Context, w audit.Window) ([]audit.DeniedGroup, error) {
		return q.Denied(ctx, audit.DeniedOptions{Window: w, Namespace: *ns, Family: fam, Limit: *limit})
	})
	if err != nil {
		return err
	}
	if a.json {
		return printJSON(append([]audit.DeniedGroup{}, gs...))
	}
	return printDenied(os.Stdout, gs)
}

// printDenied prints the denied groups as a table. RULE is blank when no
// rule decided (a denial: the policy isolates and no rule allows),
// REPORTED when no exporter reported a verdict, PROTO and PORT for the
// flows summed before rollup_policy_1m kept them (migration 0013).
func printDenied(w io.Writer, gs []audit.DeniedGroup) error {
	tw := table(w)
	fmt.Fprintln(tw, "DIRECTION\tPOLICY\tRULE\tVERDICT\tREPORTED\tSOURCE\tDESTINATION\tFAMILY\tPROTO\tPORT\tRECORDS\tLAST")
	for _, g := range gs {
		rule := ""
		if g.Rule >= 0 {
			rule = strconv.Itoa(int(g.Rule))
		}
		reported := g.ReportedVerdict
		if reported == flow.VerdictUnknown.String() {
			reported = ""
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\tIPv%d\t%s\t%s\t%d\t%s\n", g.Direction, nsName(g.PolicyNamespace, g.PolicyName), rule,
			g.Verdict, reported, nsName(g.SrcNamespace, g.SrcWorkload), nsName(g.DstNamespace, g.DstWorkload), g.IPVersion,
			g.Protocol, deniedPort(g), g.Records, g.Last.Format(time.RFC3339))
	}
	return tw.Flush()
}

// deniedPort is a denied group's PORT: the port of a protocol with ports,
// TYPE.CODE for ICMP and ICMPv6 (as nfdump shows them; the rollup keeps
// type*256+code), blank for other protocols and for flows summed before
// the rollup kept ports.
func deniedPort(g audit.DeniedGroup) string {
	switch g.Protocol {
	case flow.ProtoName(flow.ProtoTCP), flow.ProtoName(flow.ProtoUDP), flow.ProtoName(flow.ProtoSCTP):
		return strconv.Itoa(int(g.DstPort))
	case flow.ProtoName(flow.ProtoICMP), flow.ProtoName(flow.ProtoICMPv6):
		return fmt.Sprintf("%d.%d", g.DstPort>>8, g.DstPort&0xff)
	}
	return ""
}

// nsName is "namespace/name", "" when both are empty.
func nsName(ns, name string) string {
	if ns == "" && name == "" {
		return ""
	}
	return ns + "/" + name
}

func runAuditUnused(ctx context.Context, args []string) error {
	fs := newFlagSet("audit unused", "--inventory FILE | --server URL [flags]", "Rules of the NetworkPolicies that allowed no recorded flow in the window.")
	var a auditFlags
	a.bindInventory(fs)
	a.bindOutput(fs)
	a.bindStore(fs, "24h")
	if err := a.parse(fs, args); err != nil {
		return err
	}
	rep, err := ask(ctx, &a, audit.Options{}, true, api.Audit.Unused)
	if err != nil {
		return err
	}
	if a.json {
		return printJSON(rep)
	}
	fmt.Printf("%d policy decisions recorded between %s and %s\n", rep.Decisions, rep.Since.Format(time.RFC3339), rep.Until.Format(time.RFC3339))
	if len(rep.Rules) == 0 {
		fmt.Println("every rule allowed at least one flow")
	}
	for _, u := range rep.Rules {
		fmt.Println(u.Message)
	}
	return nil
}

func runAuditWhatIf(ctx context.Context, args []string) error {
	fs := newFlagSet("audit whatif", "--inventory FILE | --server URL --policy FILE [flags]", `Re-evaluate the distinct flows recorded in the window with the manifests'
policies, and with them plus the proposed ones (a proposed policy replaces
the one of the same namespace and name), and list the flows whose verdict
changes.`)
	var a auditFlags
	a.bindInventory(fs)
	a.bindOutput(fs)
	a.bindStore(fs, "6h")
	var proposed files
	fs.Var(&proposed, "policy", "proposed NetworkPolicy manifest (YAML or JSON); repeat for several")
	ns := fs.String("namespace", "default", "namespace of proposed policies that have none")
	limit := fs.Int("limit", 100000, "re-evaluate at most this many distinct flows (the most frequent)")
	if err := a.parse(fs, args); err != nil {
		return err
	}
	if len(proposed) == 0 {
		return errors.New("--policy is required")
	}
	// The proposed policies as one stream of documents, their namespace
	// defaulted, for the collector or the local replay alike.
	var docs bytes.Buffer
	for _, f := range proposed {
		b, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		ps, err := audit.DecodePolicies(f, bytes.NewReader(b), *ns)
		if err != nil {
			return err
		}
		for _, p := range ps {
			j, err := json.Marshal(p)
			if err != nil {
				return err
			}
			docs.WriteString("---\n")
			docs.Write(j)
			docs.WriteString("\n")
		}
	}
	rep, err := ask(ctx, &a, audit.Options{}, true, func(q api.Audit, ctx context.Context, w audit.Window) (*audit.WhatIfReport, error) {
		return q.WhatIf(ctx, &docs, w, *limit)
	})
	if err != nil {
		return err
	}
	if a.json {
		return printJSON(rep)
	}
	fmt.Printf("%d distinct flows between %s and %s re-evaluated", rep.Flows, rep.Since.Format(time.RFC3339), rep.Until.Format(time.RFC3339))
	if rep.Truncated {
		fmt.Print(" (limit reached: raise --limit)")
	}
	fmt.Printf(", %d would change\n", len(rep.Changes))
	tw := table(os.Stdout)
	fmt.Fprintln(tw, "CHANGE\tSOURCE\tDESTINATION\tPORT\tFAMILY\tRECORDS\tCURRENT\tWITH PROPOSAL")
	for _, c := range rep.Changes {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d/%s\tIPv%d\t%d\t%s\t%s\n", c.Change, flowEnd(c.Src), flowEnd(c.Dst), c.DstPort, c.Protocol, c.IPVersion, c.Records,
			verdictText(c.Before), verdictText(c.After))
	}
	return tw.Flush()
}

func flowEnd(e audit.FlowEnd) string {
	if e.Pod == "" {
		return e.IP
	}
	return e.Namespace + "/" + e.Pod
}

// verdictText is the deciding side of a flow: the denying one, else the
// ingress one.
func verdictText(v audit.Verdicts) string {
	s, dir := v.Ingress, "ingress"
	if v.Egress.Verdict == "denied" {
		s, dir = v.Egress, "egress"
	}
	if s.Name == "" {
		return s.Verdict
	}
	if s.Rule >= 0 {
		return fmt.Sprintf("%s by %s/%s %s rule %d", s.Verdict, s.Namespace, s.Name, dir, s.Rule)
	}
	return fmt.Sprintf("%s by %s/%s (%s)", s.Verdict, s.Namespace, s.Name, dir)
}
