package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"

	"github.com/dualflow/dualflow/collector/audit"
	"github.com/dualflow/dualflow/collector/audit/recommend"
	"github.com/dualflow/dualflow/flow"
	"github.com/dualflow/dualflow/web/api"
)

const policyHelp = `Write NetworkPolicies: recommend them from the flows observed in a window,
right for both IP families, with their proof (the replay of the window's
flows per family, and the static audit of the result).

Subcommands:
  recommend    NetworkPolicy YAML for a namespace, a workload or the cluster

  dualflow policy recommend --namespace shop > shop.yaml && kubectl apply -f shop.yaml
  dualflow policy recommend --namespace shop --workload Deployment/frontend --since 6h
  dualflow policy recommend --mode close-gaps --server http://127.0.0.1:8080 -o json`

func runPolicy(ctx context.Context, args []string) error {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		fmt.Println("Usage: dualflow policy recommend [flags]\n\n" + policyHelp)
		return nil
	}
	if args[0] == "recommend" {
		return runPolicyRecommend(ctx, args[1:], os.Stdout, os.Stderr)
	}
	return fmt.Errorf("policy: unknown subcommand %q (want recommend)", args[0])
}

func runPolicyRecommend(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("policy recommend", "[--namespace NS [--workload KIND/NAME]] [--since 1h] [--mode least-privilege|close-gaps] [--server URL] [-o yaml|json]",
		`Recommend NetworkPolicies from the flows observed in the window, for a
workload (--namespace and --workload), a namespace (--namespace) or the
whole cluster (neither), in both IP families.

  least-privilege  one policy per workload and direction that allows exactly
                   what was observed: pod and namespace selectors for pods,
                   Services as their backends on the target port, ipBlocks
                   of both families for outside peers, DNS when it was used
  close-gaps       the current policies of the scope with the missing family
                   added to every rule whose ipBlocks are of one family

The YAML goes to stdout (kubectl apply -f takes it); the replay of the
window's flows with the policies in force plus the recommendation (per
family: observed allowed flow groups kept, newly denied, newly allowed),
the static audit's findings and the notes go to stderr. -o json prints
the whole answer of GET /api/v1/policy/recommend instead.

Like 'dualflow audit', it asks the collector of --server, else the demo
running on the lab of --state-dir, else works locally from --inventory
and the flow store.`)
	var a auditFlags
	a.bindInventory(fs)
	a.srv.bind(fs)
	a.bindStore(fs, "1h")
	var req recommend.Request
	fs.StringVar(&req.Scope.Namespace, "namespace", "", "namespace whose workloads get policies (default: the whole cluster)")
	workload := fs.String("workload", "", "one workload of --namespace: KIND/NAME (Deployment/web) or NAME")
	mode := fs.String("mode", string(recommend.LeastPrivilege), "least-privilege or close-gaps")
	fs.IntVar(&req.Limit, "limit", 0, "read at most this many flow groups (0: the server's bound, --web.recommend.max-flow-groups, 300000); a window with more is refused")
	format := fs.String("o", "yaml", "output: yaml (the policies on stdout, the proof on stderr) or json (the whole answer on stdout)")
	if err := a.parse(fs, args); err != nil {
		return err
	}
	if *format != "yaml" && *format != "json" {
		return fmt.Errorf("-o %q: want yaml or json", *format)
	}
	var err error
	if req.Mode, err = recommend.ParseMode(*mode); err != nil {
		return fmt.Errorf("--mode: %w", err)
	}
	if req.Kind, req.Scope.Workload, err = recommend.ParseWorkload(*workload); err != nil {
		return fmt.Errorf("--%w", err)
	}
	rep, err := ask(ctx, &a, audit.Options{}, true, func(q api.Audit, ctx context.Context, w audit.Window) (*recommend.Report, error) {
		req.Window = w
		return recommenderOf(q).Recommend(ctx, req)
	})
	if err != nil {
		return err
	}
	if *format == "json" {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
	}
	if _, err := io.WriteString(stdout, rep.YAML); err != nil {
		return err
	}
	printRecommendProof(stderr, rep)
	return nil
}

// recommenderOf is the recommender behind the audit ask chose: the
// collector's route, or the local audit queries with recommendations.
func recommenderOf(q api.Audit) api.Recommender {
	if r, ok := q.(api.Recommender); ok {
		return r
	}
	return &recommend.Queries{Queries: q.(*audit.Queries)}
}

var _ api.Recommender = remoteAudit{}

// Recommend asks GET /api/v1/policy/recommend.
func (r remoteAudit) Recommend(ctx context.Context, req recommend.Request) (*recommend.Report, error) {
	q := windowValues(req.Window)
	q.Set("mode", string(req.Mode))
	if req.Scope.Namespace != "" {
		q.Set("namespace", req.Scope.Namespace)
	}
	if w := req.Scope.Workload; w != "" {
		if req.Kind != "" {
			w = req.Kind + "/" + w
		}
		q.Set("workload", w)
	}
	if req.Limit != 0 {
		q.Set("limit", strconv.Itoa(req.Limit))
	}
	res := new(recommend.Report)
	return res, r.c.do(ctx, http.MethodGet, "/policy/recommend", q, nil, res)
}

// printRecommendProof prints what proves a recommendation: its policies,
// the replay per family with the flow groups it would newly deny or
// allow, the static audit's findings, and the notes.
func printRecommendProof(w io.Writer, rep *recommend.Report) {
	fmt.Fprintf(w, "# %d policies (%s) from %d flow groups observed between %s and %s\n", len(rep.Policies), rep.Mode, rep.Flows,
		rep.Since.Format("2006-01-02T15:04:05Z07:00"), rep.Until.Format("2006-01-02T15:04:05Z07:00"))
	fmt.Fprint(w, (&recommend.ReplayReport{Families: rep.Replay}).String())
	tw := table(w)
	for _, f := range rep.Replay {
		for _, x := range [...]struct {
			change string
			flows  []recommend.ReplayedFlow
		}{{"newly-denied", f.NewlyDenied}, {"newly-allowed", f.NewlyAllowed}} {
			for _, g := range x.flows {
				fmt.Fprintf(tw, "  %s\tIPv%d\t%s\t%s\t%d/%s\t%s\n", x.change, g.IPVersion, flowEnd(g.Src), flowEnd(g.Dst), g.DstPort, flow.ProtoName(g.Protocol), verdictText(g.After))
			}
		}
	}
	tw.Flush()
	if len(rep.Findings) > 0 {
		fmt.Fprintf(w, "Static audit with the recommendation: %d findings\n", len(rep.Findings))
		printFindings(w, rep.Findings)
	} else {
		fmt.Fprintln(w, "Static audit with the recommendation: no findings")
	}
	printDiff(w, rep.Diff)
	for _, n := range rep.Notes {
		fmt.Fprintln(w, "Note:", n)
	}
}

// maxDiffs bounds the policies whose diff the proof prints (-o json has
// them all).
const maxDiffs = 20

// printDiff prints the recommendation against the policies in force: each
// policy's summary, and a changed one's unified diff.
func printDiff(w io.Writer, ds []recommend.PolicyDiff) {
	var added, changed int
	for _, d := range ds {
		if d.Change == recommend.Changed {
			changed++
		} else {
			added++
		}
	}
	fmt.Fprintf(w, "Against the policies in force: %d added, %d changed\n", added, changed)
	for i, d := range ds {
		if i == maxDiffs {
			fmt.Fprintf(w, "  ... and %d more (-o json gives every diff)\n", len(ds)-i)
			break
		}
		for _, s := range d.Summary {
			fmt.Fprintln(w, "  "+s)
		}
		if d.Unified != "" {
			for _, l := range strings.Split(strings.TrimRight(d.Unified, "\n"), "\n") {
				fmt.Fprintln(w, "    "+l)
			}
		}
	}
}
