// Command dualflow is the single binary of dualflow: exporter, collector,
// lab, traceflow and web UI are subcommands. Run `dualflow --help`.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"slices"
	"syscall"

	"k8s.io/klog/v2"

	"github.com/dualflow/dualflow/lab/labcmd"
)

// command is one subcommand. run gets the arguments after the subcommand
// name and a context cancelled on SIGINT/SIGTERM.
type command struct {
	name    string
	summary string
	run     func(ctx context.Context, args []string) error
}

// services are the long-running commands, which log (log/slog) while
// they run: their final error is one more log line of the same format,
// for their journal. Other commands print theirs as "dualflow: <message>".
var services = []string{"collector", "exporter", "store"}

func commands() []command {
	return []command{
		{"collector", "receive flows, enrich them, write them to ClickHouse; serve the web UI and REST API", runCollector},
		{"exporter", "export kernel conntrack connections as IPFIX (one per node)", runExporter},
		{"lab", "build a dual-stack lab cluster in network namespaces", labCommands().Lab},
		{"demo", "run the whole product on one machine: the collector plus a lab and its exporters (make run)", labCommands().Demo},
		{"store", "own the embedded ClickHouse store and serve it to several collectors on one machine (HTTP interface)", runStore},
		{"migrate", "apply the ClickHouse schema migrations (or print them)", runMigrate},
		{"trace", "inject a probe at a pod and print its path per IP family (lab, or a collector with --server)", runTrace},
		{"sql", "run a SQL query against the flow store and print the result", runSQL},
		{"audit", "audit NetworkPolicies: verdicts, denied flows, unused rules, dual-stack gaps, what-if", runAudit},
		{"policy", "recommend NetworkPolicies for both IP families from observed flows, with their replay", runPolicy},
		{"certs", "issue the TLS certificates of a deployment from a private CA (clusters without cert-manager)", runCerts},
		{"version", "print version and commit", runVersion},
	}
}

func usage(w io.Writer) {
	fmt.Fprintf(w, `dualflow: flow observability and NetworkPolicy auditing for IPv4, IPv6 and dual-stack Kubernetes.

Usage:
  dualflow <command> [flags]

Commands:
`)
	for _, c := range commands() {
		fmt.Fprintf(w, "  %-10s %s\n", c.name, c.summary)
	}
	fmt.Fprintf(w, "\nRun 'dualflow <command> --help' for the flags of a command.\n")
}

func main() {
	routeKlog(slog.Default())
	if len(os.Args) < 2 {
		usage(os.Stderr)
		os.Exit(2)
	}
	name := os.Args[1]
	if name == "-h" || name == "--help" || name == "help" {
		usage(os.Stdout)
		return
	}
	for _, c := range commands() {
		if c.name != name {
			continue
		}
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		err := c.run(ctx, os.Args[2:])
		stop()
		os.Exit(exit(os.Stderr, c, err))
	}
	fmt.Fprintf(os.Stderr, "dualflow: unknown command %q\n\n", name)
	usage(os.Stderr)
	os.Exit(2)
}

// reportedError is a failure the command has told the user about on
// stdout already (dualflow trace's last line): main exits 1 without
// printing it again.
type reportedError struct{ error }

// exit reports the error c.run returned and returns the exit status: 0
// without one, 1 with one, which a service logs (slog) and another
// command prints as "dualflow: <message>" on w.
func exit(w io.Writer, c command, err error) int {
	var reported reportedError
	switch {
	case err == nil || errors.Is(err, flag.ErrHelp):
		return 0
	case errors.As(err, &reported):
	case slices.Contains(services, c.name):
		slog.Error("dualflow "+c.name+" failed", "err", err)
	default:
		fmt.Fprintf(w, "dualflow: %v\n", err)
	}
	return 1
}

// labCommands are the lab side of the binary (package labcmd): the lab,
// the demo and in-lab traces.
func labCommands() *labcmd.Commands {
	return &labcmd.Commands{Version: version, NewFlagSet: newFlagSet}
}

// newFlagSet returns a flag set for a subcommand whose --help prints the
// summary, the usage line and every flag with its default.
func newFlagSet(name, synopsis, help string) *flag.FlagSet {
	fs := flag.NewFlagSet("dualflow "+name, flag.ContinueOnError)
	fs.Usage = func() {
		out := fs.Output()
		fmt.Fprintf(out, "Usage: dualflow %s %s\n\n%s\n\nFlags:\n", name, synopsis, help)
		fs.PrintDefaults()
	}
	return fs
}

// routeKlog sends what client-go and go-ipfix log through klog (watch
// errors, throttling, connection notices) to logger, so that the process
// writes one log format.
func routeKlog(logger *slog.Logger) { klog.SetSlogLogger(logger) }
