// Command benchtable reads `go test -bench -benchmem` output on stdin and
// prints a readable table: one row per benchmark with ns/op, B/op,
// allocs/op and every custom metric (records/s, bytes/row, …).
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
	if failed {
		os.Exit(1)
	}
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
