// Command render renders dualflow's Kubernetes manifests in-process, as
// `kubectl kustomize` and `helm template` would, and prints the YAML
// stream on stdout:
//
//	render kustomize DIR
//	render helm CHART [-f VALUES.yaml]... [--set key=value]...
//
// It is a module of its own (kustomize and Helm pull Kubernetes libraries
// of other versions than the main module's); test/e2e/deploy_test.go
// builds and runs it.
package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"os"
	"path"
	"sort"
	"strings"

	"helm.sh/helm/v4/pkg/chart/common"
	chartutil "helm.sh/helm/v4/pkg/chart/common/util"
	"helm.sh/helm/v4/pkg/chart/v2/loader"
	chartv2util "helm.sh/helm/v4/pkg/chart/v2/util"
	"helm.sh/helm/v4/pkg/engine"
	"helm.sh/helm/v4/pkg/strvals"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "render:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	if len(args) < 2 {
		return errors.New("usage: render kustomize DIR | render helm CHART [-f VALUES]... [--set k=v]...")
	}
	var out []byte
	var err error
	switch args[0] {
	case "kustomize":
		out, err = kustomize(args[1])
	case "helm":
		out, err = helm(args[1], args[2:])
	default:
		return fmt.Errorf("unknown renderer %q", args[0])
	}
	if err != nil {
		return err
	}
	_, err = os.Stdout.Write(out)
	return err
}

// kustomize builds the kustomization in dir with kustomize's defaults.
func kustomize(dir string) ([]byte, error) {
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	m, err := k.Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		return nil, fmt.Errorf("kustomize %s: %w", dir, err)
	}
	return m.AsYaml()
}

// stringList is a repeatable flag.
type stringList []string

func (s *stringList) String() string     { return strings.Join(*s, ",") }
func (s *stringList) Set(v string) error { *s = append(*s, v); return nil }

// helm renders the chart as `helm template dualflow CHART -n dualflow`
// does: values files in order, then --set, checked against the chart's
// values.schema.json; NOTES.txt is left out.
func helm(chartDir string, args []string) ([]byte, error) {
	fs := flag.NewFlagSet("helm", flag.ContinueOnError)
	var files, sets stringList
	fs.Var(&files, "f", "values file (repeatable)")
	fs.Var(&sets, "set", "key=value (repeatable)")
	name := fs.String("name", "dualflow", "release name")
	ns := fs.String("namespace", "dualflow", "release namespace")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	chrt, err := loader.Load(chartDir)
	if err != nil {
		return nil, fmt.Errorf("load chart %s: %w", chartDir, err)
	}
	vals := map[string]any{}
	for _, f := range files {
		v, err := common.ReadValuesFile(f)
		if err != nil {
			return nil, err
		}
		vals = chartutil.MergeTables(v.AsMap(), vals) // later files win
	}
	for _, s := range sets {
		if err := strvals.ParseInto(s, vals); err != nil {
			return nil, fmt.Errorf("--set %s: %w", s, err)
		}
	}
	if err := chartv2util.ProcessDependencies(chrt, vals); err != nil {
		return nil, err
	}
	rv, err := chartutil.ToRenderValues(chrt, vals, common.ReleaseOptions{
		Name: *name, Namespace: *ns, Revision: 1, IsInstall: true,
	}, common.DefaultCapabilities)
	if err != nil {
		return nil, err
	}
	files2, err := engine.Render(chrt, rv)
	if err != nil {
		return nil, err
	}
	names := make([]string, 0, len(files2))
	for n := range files2 {
		names = append(names, n)
	}
	sort.Strings(names)
	var b bytes.Buffer
	for _, n := range names {
		if path.Base(n) == "NOTES.txt" || strings.TrimSpace(files2[n]) == "" {
			continue
		}
		fmt.Fprintf(&b, "---\n# Source: %s\n%s\n", n, strings.TrimSpace(files2[n]))
	}
	return b.Bytes(), nil
}
