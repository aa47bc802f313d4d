package migrations

import (
	"flag"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"testing/fstest"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

func TestRenderGolden(t *testing.T) {
	tests := []struct {
		name string
		opt  Options
	}{
		{"single", Options{TTLDays: 30}},
		{"single_no_ttl", Options{}},
		{"cluster", Options{Cluster: "flows", TTLDays: 30}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := RenderAll(tt.opt)
			if err != nil {
				t.Fatal(err)
			}
			path := filepath.Join("testdata", tt.name+".sql")
			if *update {
				if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (run go test ./migrations -update)", err)
			}
			if got != string(want) {
				t.Errorf("rendered %s differs from %s; run go test ./migrations -update and review the diff", tt.name, path)
			}
		})
	}
}

// TestClusterForm checks the structure of the cluster rendering: every DDL
// runs ON CLUSTER, every table is a Replicated engine under a _local name,
// materialized views read and write local tables, and every local table that
// users query has a Distributed table under the plain name.
func TestClusterForm(t *testing.T) {
	all, err := All()
	if err != nil {
		t.Fatal(err)
	}
	opt := Options{Cluster: "flows", TTLDays: 7}
	createTable := regexp.MustCompile(`^CREATE (?:OR REPLACE )?TABLE (?:IF NOT EXISTS )?(\S+) ON CLUSTER 'flows'`)
	distEngine := regexp.MustCompile(`(?s)ENGINE = Distributed\('flows', 'dualflow', (\w+), (.*)\)$`)
	flushDist := regexp.MustCompile(`^SYSTEM FLUSH DISTRIBUTED (\S+) ON CLUSTER 'flows'$`)
	shardingKey := map[string]string{} // Distributed table: its key after all migrations
	createMV := regexp.MustCompile(`^CREATE MATERIALIZED VIEW IF NOT EXISTS (\S+) ON CLUSTER 'flows'\s+TO (\S+) AS`)
	alterTable := regexp.MustCompile(`(?s)^ALTER TABLE (\S+) ON CLUSTER 'flows'\s+(.*)$`)
	addColumn := regexp.MustCompile(`(?m)(ADD COLUMN .*?),?$`)
	added := func(alter string) (cols []string) { // the ADD COLUMN clauses
		for _, m := range addColumn.FindAllStringSubmatch(alter, -1) {
			cols = append(cols, m[1])
		}
		return cols
	}
	locals := map[string]bool{}
	distributed := map[string]bool{}
	for _, m := range all {
		stmts, err := Render(m, opt)
		if err != nil {
			t.Fatal(err)
		}
		flushed := map[string]bool{} // Distributed tables flushed earlier in m
		for _, s := range stmts {
			switch {
			case strings.Contains(s, "ENGINE = Distributed("):
				mm := createTable.FindStringSubmatch(s)
				if mm == nil {
					t.Fatalf("%s: Distributed table without ON CLUSTER: %.80s", m.Name, s)
				}
				if strings.HasPrefix(s, "CREATE OR REPLACE") && (!distributed[mm[1]] || !flushed[mm[1]]) {
					// Replacing is only for a Distributed table that exists,
					// after its pending background sends were flushed.
					t.Errorf("%s: CREATE OR REPLACE of %s without an earlier Distributed table and SYSTEM FLUSH DISTRIBUTED", m.Name, mm[1])
				}
				distributed[mm[1]] = true
				em := distEngine.FindStringSubmatch(s)
				if em == nil || em[1] != strings.TrimPrefix(mm[1], "dualflow.")+"_local" || !strings.Contains(s, " AS "+mm[1]+"_local\n") {
					t.Errorf("%s: Distributed table %s does not point at its local table: %.200s", m.Name, mm[1], s)
				} else {
					shardingKey[mm[1]] = em[2]
				}
				// Retention is per shard, on the local tables.
				if strings.Contains(s, "TTL") {
					t.Errorf("%s: Distributed table %s has a TTL", m.Name, mm[1])
				}
			case strings.HasPrefix(s, "CREATE OR REPLACE"):
				// Replacing a local table would drop its rows.
				t.Errorf("%s: CREATE OR REPLACE of a table that is not Distributed: %.80s", m.Name, s)
			case strings.HasPrefix(s, "SYSTEM FLUSH DISTRIBUTED"):
				mm := flushDist.FindStringSubmatch(s)
				if mm == nil || !distributed[mm[1]] {
					t.Errorf("%s: SYSTEM FLUSH DISTRIBUTED must name a Distributed table ON CLUSTER: %.80s", m.Name, s)
				} else {
					flushed[mm[1]] = true
				}
			case strings.HasPrefix(s, "CREATE TABLE"):
				mm := createTable.FindStringSubmatch(s)
				if mm == nil {
					t.Fatalf("%s: CREATE TABLE without ON CLUSTER: %.80s", m.Name, s)
				}
				if !strings.HasSuffix(mm[1], "_local") {
					t.Errorf("%s: table %s is not a _local table", m.Name, mm[1])
				}
				if !regexp.MustCompile(`ENGINE = Replicated\w*MergeTree\('/clickhouse/tables/\{shard\}/\{database\}/\{table\}', '\{replica\}'\)`).MatchString(s) {
					t.Errorf("%s: table %s is not replicated", m.Name, mm[1])
				}
				if !strings.Contains(s, "INTERVAL 7 DAY") {
					t.Errorf("%s: table %s has no TTL", m.Name, mm[1])
				}
				locals[strings.TrimSuffix(mm[1], "_local")] = true
			case strings.HasPrefix(s, "CREATE MATERIALIZED VIEW"):
				mm := createMV.FindStringSubmatch(s)
				if mm == nil {
					t.Fatalf("%s: MV without ON CLUSTER or TO: %.120s", m.Name, s)
				}
				// Rollups are per shard: each shard's view reads the rows
				// inserted into that shard's flows_local and writes its own
				// local rollup; reads sum across shards.
				if !strings.HasSuffix(mm[1], "_local") || !strings.HasSuffix(mm[2], "_local") || !regexp.MustCompile(`(?m)^FROM dualflow\.flows_local$`).MatchString(s) || strings.Count(s, "FROM ") != 1 {
					t.Errorf("%s: MV %s must read flows_local (only) and write a local table", m.Name, mm[1])
				}
			case strings.HasPrefix(s, "ALTER TABLE"):
				// Settings and columns change on the local tables, on every
				// replica; a column added there is added to the Distributed
				// table too, in the same migration, or inserts and reads
				// through it could not name it. (The local statement may
				// do more, such as extend its sorting key with the columns.)
				mm := alterTable.FindStringSubmatch(s)
				switch {
				case mm == nil:
					t.Errorf("%s: ALTER TABLE must be ON CLUSTER: %.80s", m.Name, s)
				case strings.HasSuffix(mm[1], "_local"):
					if cols := added(mm[2]); cols != nil && !slices.ContainsFunc(stmts, func(o string) bool {
						om := alterTable.FindStringSubmatch(o)
						return om != nil && om[1] == strings.TrimSuffix(mm[1], "_local") && slices.Equal(added(om[2]), cols)
					}) {
						t.Errorf("%s: column added to %s but not to its Distributed table: %.80s", m.Name, mm[1], s)
					}
				case !strings.HasPrefix(mm[2], "ADD COLUMN"):
					t.Errorf("%s: only ADD COLUMN may name a Distributed table: %.80s", m.Name, s)
				}
			default:
				t.Errorf("%s: unexpected statement: %.80s", m.Name, s)
			}
		}
	}
	for l := range locals {
		if !distributed[l] {
			t.Errorf("local table %s_local has no Distributed table %s", l, l)
		}
	}
	// The tables inserted through are sharded by the documented,
	// deterministic keys (docs/cluster.md); the rollups' Distributed tables
	// are only read, and keep rand().
	for d, got := range shardingKey {
		want, ok := ShardingKeys[strings.TrimPrefix(d, "dualflow.")]
		if !ok {
			want = "rand()"
		}
		if got != want {
			t.Errorf("Distributed table %s is sharded by %s, want %s", d, got, want)
		}
	}
	for table := range ShardingKeys {
		if _, ok := shardingKey["dualflow."+table]; !ok {
			t.Errorf("ShardingKeys names %s, which has no Distributed table", table)
		}
	}
	for _, want := range []string{"flows", "rollup_pod_to_pod_1m", "rollup_pod_to_service_1m", "rollup_node_to_node_1m", "rollup_policy_1m", "traceflows"} {
		if !locals["dualflow."+want] {
			t.Errorf("cluster form has no %s_local table (found %v)", want, locals)
		}
	}
}

func TestSingleForm(t *testing.T) {
	got, err := RenderAll(Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{"ON CLUSTER", "Replicated", "Distributed", "_local", "TTL ", "{{"} {
		if strings.Contains(got, bad) {
			t.Errorf("single-node form without TTL contains %q", bad)
		}
	}
}

func TestLoadRejectsBadFiles(t *testing.T) {
	tests := []struct {
		name  string
		files fstest.MapFS
	}{
		{"bad name", fstest.MapFS{"1_x.sql": {Data: []byte("SELECT 1")}}},
		{"duplicate version", fstest.MapFS{"0001_a.sql": {Data: []byte("SELECT 1")}, "0001_b.sql": {Data: []byte("SELECT 1")}}},
	}
	for _, tt := range tests {
		if _, err := load(tt.files); err == nil {
			t.Errorf("%s: load succeeded", tt.name)
		}
	}
}

func TestOptionsValidate(t *testing.T) {
	for _, o := range []Options{{Database: "x;DROP"}, {Database: "ok", Cluster: "a'b"}, {Database: "ok", TTLDays: -1}} {
		if o.Validate() == nil {
			t.Errorf("Validate(%+v) = nil, want error", o)
		}
	}
}
