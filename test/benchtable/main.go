// Command benchtable reads `go test -bench -benchmem` output on stdin and
// prints a readable table: one row per benchmark with ns/op, B/op,
// allocs/op and every custom metric (records/s, bytes/row, …), then the
// shares of the engine's ceiling: the writer's (reported by
// BenchmarkWriterEmbedded* as %-of-ceiling, from alternated runs) and the
// end-to-end pipeline's (BenchmarkEndToEnd/enriched's %-of-ceiling, from
// runs alternated with the ceiling of its own rows; the other EndToEnd
// variants over the writer's 5M ceiling, indicatively), with the targets
// of the issue "the writer close to the engine's own limit".
package main

import (
	"bufio"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
)

type result struct {
	pkg, name string
	metrics   map[string]float64
}

func main() {
	var results []result
	units := map[string]bool{}
	var pkg string
	failed := false
	sc := bufio.NewScanner(os.Stdin)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "pkg: "):
			pkg = strings.TrimPrefix(line, "pkg: github.com/dualflow/dualflow/")
		case strings.HasPrefix(line, "--- FAIL") || strings.HasPrefix(line, "FAIL"):
			failed = true
			fmt.Println(line)
		case strings.HasPrefix(line, "Benchmark"):
			f := strings.Fields(line)
			if len(f) < 4 || len(f)%2 != 0 {
				continue
			}
			r := result{pkg: pkg, name: strings.TrimPrefix(f[0], "Benchmark"), metrics: map[string]float64{}}
			for i := 2; i+1 < len(f); i += 2 {
				v, err := strconv.ParseFloat(f[i], 64)
				if err != nil {
					continue
				}
				r.metrics[f[i+1]] = v
				units[f[i+1]] = true
			}
			results = append(results, r)
		}
	}
	std := []string{"ns/op", "B/op", "allocs/op"}
	var custom []string
	for u := range units {
		if u != "ns/op" && u != "B/op" && u != "allocs/op" {
			custom = append(custom, u)
		}
	}
	sort.Strings(custom)
	cols := append(std, custom...)
	w := map[string]int{"benchmark": len("benchmark")}
	for _, r := range results {
		w["benchmark"] = max(w["benchmark"], len(r.pkg)+1+len(r.name))
	}
	for _, c := range cols {
		w[c] = len(c)
		for _, r := range results {
			if v, ok := r.metrics[c]; ok {
				w[c] = max(w[c], len(format(v)))
			}
		}
	}
	fmt.Printf("%-*s", w["benchmark"], "benchmark")
	for _, c := range cols {
		fmt.Printf("  %*s", w[c], c)
	}
	fmt.Println()
	for _, r := range results {
		fmt.Printf("%-*s", w["benchmark"], r.pkg+" "+r.name)
		for _, c := range cols {
			s := "-"
			if v, ok := r.metrics[c]; ok {
				s = format(v)
			}
			fmt.Printf("  %*s", w[c], s)
		}
		fmt.Println()
	}
	printCeilingShares(results)
	if failed {
		os.Exit(1)
	}
}

// Targets, as shares of the engine's ceiling.
const (
	writerTarget    = 85 // the writer (BenchmarkWriterEmbedded*)
	endToEndTarget  = 70 // the enriched pipeline, IPFIX over TCP to rows (BenchmarkEndToEnd/enriched)
	ceilingRef      = "collector/store WriterEmbedded5M/pods=2000"
	endToEndPackage = "collector"
)

// printCeilingShares prints each writer's share of the engine's ceiling and
// each end-to-end rate as a share of the 5M ceiling, when the run has them.
func printCeilingShares(results []result) {
	var lines []string
	ceiling := 0.0
	for _, r := range results {
		name := r.pkg + " " + trimProcs(r.name)
		if name == ceilingRef {
			ceiling = r.metrics["ceiling-rows/s"]
		}
		share, ok := r.metrics["%-of-ceiling"]
		if !ok {
			continue
		}
		if isEndToEnd(r) {
			// Measured against the ceiling of its own rows, alternated.
			lines = append(lines, fmt.Sprintf("%s: pipeline %s records/s, ceiling of the same rows %s rows/s: %.1f%% (target %d%%: %s)",
				name, format(r.metrics["records/s"]), format(r.metrics["ceiling-rows/s"]), share, endToEndTarget, verdict(share, endToEndTarget)))
			continue
		}
		lines = append(lines, fmt.Sprintf("%s: writer %s rows/s, ceiling %s rows/s: %.1f%% (target %d%%: %s)",
			name, format(r.metrics["rows/s"]), format(r.metrics["ceiling-rows/s"]), share, writerTarget, verdict(share, writerTarget)))
	}
	indicative := false
	if ceiling > 0 {
		for _, r := range results {
			if !isEndToEnd(r) || r.metrics["records/s"] == 0 {
				continue
			}
			if _, own := r.metrics["%-of-ceiling"]; own {
				continue
			}
			name := trimProcs(r.name)
			share := 100 * r.metrics["records/s"] / ceiling
			lines = append(lines, fmt.Sprintf("%s %s: %s records/s: %.1f%% of the writer's 5M ceiling (%s rows/s)", r.pkg, name, format(r.metrics["records/s"]), share, format(ceiling)))
			indicative = true
		}
	}
	if len(lines) == 0 {
		return
	}
	if indicative {
		// BenchmarkEndToEnd's rows are the lab inventory's 40 connections,
		// narrower and aggregating more in the rollups than the ceiling's
		// 2,000-pod rows: a share above 100% is possible and the share is
		// indicative until the ceiling is measured on the same rows.
		lines = append(lines, "(those EndToEnd rows differ from the writer ceiling's: their shares are indicative)")
	}
	fmt.Println()
	fmt.Println("shares of the engine's ceiling (the same Native blocks inserted with no Go work):")
	for _, l := range lines {
		fmt.Println("  " + l)
	}
}

// isEndToEnd reports a BenchmarkEndToEnd result.
func isEndToEnd(r result) bool {
	return r.pkg == endToEndPackage && strings.HasPrefix(r.name, "EndToEnd/")
}

func verdict(share float64, target int) string {
	if share >= float64(target) {
		return "met"
	}
	return "not met"
}

// trimProcs removes the -GOMAXPROCS suffix go test adds to a name.
func trimProcs(name string) string {
	if i := strings.LastIndexByte(name, '-'); i > 0 {
		if _, err := strconv.Atoi(name[i+1:]); err == nil {
			return name[:i]
		}
	}
	return name
}

func format(v float64) string {
	switch {
	case v >= 1e6:
		return strconv.FormatFloat(v/1e6, 'f', 2, 64) + "M"
	case v >= 1e4:
		return strconv.FormatFloat(v/1e3, 'f', 1, 64) + "k"
	case v == float64(int64(v)):
		return strconv.FormatInt(int64(v), 10)
	default:
		return strconv.FormatFloat(v, 'f', 2, 64)
	}
}
