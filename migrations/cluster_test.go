package migrations

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/dualflow/dualflow/internal/chsql"
)

// The cluster form cannot run on chDB (no cluster, no Keeper), so these
// tests check what the engine can: every cluster statement parses, the
// settings it names exist, and the sharding keys type-check against the
// tables the single-node form creates.

func clusterStatements(t *testing.T) []string {
	t.Helper()
	all, err := All()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, m := range all {
		stmts, err := Render(m, Options{Cluster: "flows", TTLDays: 30})
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, stmts...)
	}
	return out
}

func TestClusterDDLParses(t *testing.T) {
	if db == nil {
		t.Skip("libchdb not available (make deps)")
	}
	ctx := context.Background()
	for _, s := range clusterStatements(t) {
		if _, err := db.Query(ctx, "EXPLAIN AST "+s, "TabSeparated"); err != nil {
			t.Errorf("cluster statement does not parse: %v\n%s", err, s)
		}
	}
}

func TestClusterSettingsExist(t *testing.T) {
	if db == nil {
		t.Skip("libchdb not available (make deps)")
	}
	ctx := context.Background()
	modify := regexp.MustCompile(`MODIFY SETTING (.*)$`)
	names := map[string]bool{}
	for _, s := range clusterStatements(t) {
		if m := modify.FindStringSubmatch(s); m != nil {
			for _, kv := range strings.Split(m[1], ",") {
				names[strings.TrimSpace(strings.SplitN(kv, "=", 2)[0])] = true
			}
		}
	}
	if !names["replicated_deduplication_window_seconds"] {
		t.Errorf("no migration sets replicated_deduplication_window_seconds (found %v)", names)
	}
	for n := range names {
		out, err := db.Query(ctx, "SELECT count() FROM system.merge_tree_settings WHERE name = "+chsql.String(n), "TabSeparated")
		if err != nil || strings.TrimSpace(string(out)) != "1" {
			t.Errorf("MergeTree setting %s: %s %v", n, out, err)
		}
	}
	// The setting writers send for synchronous Distributed inserts
	// (docs/cluster.md); insert_distributed_sync is its older alias.
	out, err := db.Query(ctx, "SELECT name, alias_for FROM system.settings WHERE name IN ('distributed_foreground_insert', 'insert_distributed_sync') ORDER BY name", "TabSeparated")
	if err != nil || string(out) != "distributed_foreground_insert\t\ninsert_distributed_sync\tdistributed_foreground_insert\n" {
		t.Errorf("distributed_foreground_insert: %q %v", out, err)
	}
}

func TestShardingKeys(t *testing.T) {
	r := newRunner(t, "df_sharding")
	ctx := context.Background()
	if _, err := r.Up(ctx); err != nil {
		t.Fatal(err)
	}
	for table, key := range ShardingKeys {
		out, err := db.Query(ctx, "DESCRIBE (SELECT "+key+" AS k FROM df_sharding."+table+")", "TabSeparated")
		if err != nil || !strings.HasPrefix(string(out), "k\tUInt64\t") {
			t.Errorf("sharding key of %s (%s): %q %v; a Distributed sharding key must be an integer", table, key, out, err)
		}
	}
	// Records of one workload pair, IPv4 or IPv6, land on one shard.
	err := db.Exec(ctx, `INSERT INTO df_sharding.flows (flow_end, ip_version, src_ip_in, dst_ip_in, src_pod_namespace, src_workload_name, dst_pod_namespace, dst_workload_name) VALUES
		(now64(3), 4, toIPv6('198.18.0.10'), toIPv6('198.18.1.20'), 'shop', 'web', 'shop', 'db'),
		(now64(3), 6, toIPv6('fd00:10::a'), toIPv6('fd00:10:1::14'), 'shop', 'web', 'shop', 'db'),
		(now64(3), 6, toIPv6('fd00:10::b'), toIPv6('fd00:10:1::15'), 'shop', 'db', 'shop', 'web')`)
	if err != nil {
		t.Fatal(err)
	}
	out, err := db.Query(ctx, "SELECT uniqExact("+ShardingKeys["flows"]+") FROM df_sharding.flows GROUP BY src_workload_name ORDER BY src_workload_name", "TabSeparated")
	if err != nil || string(out) != "1\n1\n" {
		t.Errorf("keys per workload pair: %q %v, want one each", out, err)
	}
}

func TestClusterMigrationSingleNodeNoop(t *testing.T) {
	all, err := All()
	if err != nil {
		t.Fatal(err)
	}
	var m0007 *Migration
	for i := range all {
		if all[i].Version == 7 {
			m0007 = &all[i]
		}
	}
	if m0007 == nil {
		t.Fatal("no migration 0007")
	}
	for _, opt := range []Options{{}, {TTLDays: 30}} {
		stmts, err := Render(*m0007, opt)
		if err != nil || len(stmts) != 0 {
			t.Errorf("0007 single node (%+v) renders %q, %v; want nothing", opt, stmts, err)
		}
	}
	r := newRunner(t, "df_0007")
	if _, err := r.Up(context.Background()); err != nil {
		t.Fatal(err)
	}
	st, err := r.Status(context.Background())
	if err != nil || !recorded(st, 7) {
		t.Errorf("0007 not recorded on a single node: %v %v", st, err)
	}
}

func recorded(st []Applied, v int) bool {
	for _, a := range st {
		if a.Version == v {
			return true
		}
	}
	return false
}

// TestShardingKeysDocumented keeps docs/cluster.md in step with the keys.
func TestShardingKeysDocumented(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join("..", "docs", "cluster.md"))
	if err != nil {
		t.Fatal(err)
	}
	for table, key := range ShardingKeys {
		if !strings.Contains(string(doc), "| `"+table+"` | `"+table+"_local` |") || !strings.Contains(string(doc), "`"+key+"`") {
			t.Errorf("docs/cluster.md does not give %s its sharding key %s", table, key)
		}
	}
}

// TestClusterFormOnLocalShard runs the whole cluster form on the engine,
// with the cluster "flows" as one local shard (runner_test.go's
// clusterConfig): ON CLUSTER is dropped and the Replicated engines are
// unreplicated (no Keeper), everything else, the Distributed tables and
// 0007's replacements included, runs as rendered. Rows are then inserted
// through the Distributed tables as the collector must insert them
// (docs/cluster.md), twice with one token.
func TestClusterFormOnLocalShard(t *testing.T) {
	if db == nil {
		t.Skip("libchdb not available (make deps)")
	}
	ctx := context.Background()
	out, err := db.Query(ctx, "SELECT count() FROM system.clusters WHERE cluster = 'flows' AND is_local", "TabSeparated")
	if err != nil || strings.TrimSpace(string(out)) != "1" {
		t.Fatalf("engine has no local cluster flows (config.xml not read?): %q %v", out, err)
	}
	const database = "df_cluster"
	unreplicated := regexp.MustCompile(`Replicated(\w*MergeTree)\('/clickhouse/tables/\{shard\}/\{database\}/\{table\}', '\{replica\}'\)`)
	if err := db.Exec(ctx, "CREATE DATABASE IF NOT EXISTS "+database); err != nil {
		t.Fatal(err)
	}
	all, err := All()
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range all {
		stmts, err := Render(m, Options{Database: database, Cluster: "flows", TTLDays: 30})
		if err != nil {
			t.Fatal(err)
		}
		for i, s := range stmts {
			s = strings.ReplaceAll(s, " ON CLUSTER 'flows'", "")
			s = unreplicated.ReplaceAllString(s, "$1")
			if err := db.Exec(ctx, s); err != nil {
				t.Fatalf("%s statement %d: %v\n%s", m.Name, i+1, err, s)
			}
		}
	}
	out, err = db.Query(ctx, "SELECT name, engine_full FROM system.tables WHERE database = '"+database+"' AND engine = 'Distributed' ORDER BY name", "TabSeparatedRaw")
	if err != nil {
		t.Fatal(err)
	}
	dists := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		name, engine, _ := strings.Cut(line, "\t")
		dists[name] = engine
	}
	for _, table := range []string{"flows", "rollup_pod_to_pod_1m", "rollup_pod_to_service_1m", "rollup_node_to_node_1m", "rollup_policy_1m", "traceflows"} {
		want, ok := ShardingKeys[table]
		if !ok {
			want = "rand()"
		}
		if e := dists[table]; !strings.HasSuffix(e, ", "+want+")") || strings.Contains(e, "TTL") {
			t.Errorf("Distributed %s: %q, want sharding key %s and no TTL", table, e, want)
		}
	}

	// The settings the collector's writer sends (docs/cluster.md).
	const settings = " SETTINGS distributed_foreground_insert = 1, insert_deduplication_token = 'cluster-test-1', deduplicate_blocks_in_dependent_materialized_views = 1"
	insert := `INSERT INTO ` + database + `.flows (flow_end, ip_version, src_ip_in, dst_ip_in, src_ip, dst_ip, src_port, dst_port, protocol, bytes, reverse_bytes,
		src_pod_namespace, src_pod_name, src_workload_name, dst_pod_namespace, dst_pod_name, dst_workload_name)` + settings + ` VALUES
		(now64(3), 4, toIPv6('198.18.0.10'), toIPv6('198.18.1.20'), '198.18.0.10', '198.18.1.20', 40000, 5432, 6, 100, 10, 'shop', 'web-1', 'web', 'shop', 'db-0', 'db'),
		(now64(3), 6, toIPv6('fd00:10::a'), toIPv6('fd00:10:1::14'), 'fd00:10::a', 'fd00:10:1::14', 40001, 5432, 6, 200, 20, 'shop', 'web-1', 'web', 'shop', 'db-0', 'db')`
	for range 2 { // a replay of the same batch is stored once
		if err := db.Exec(ctx, insert); err != nil {
			t.Fatal(err)
		}
	}
	tests := []struct{ name, query, want string }{
		{"rows stored once", "SELECT count() FROM " + database + ".flows", "2"},
		{"IPv4 row", "SELECT src_ip, dst_ip, toString(src_ip_bin), toString(dst_ip_bin), _shard_num FROM " + database + ".flows WHERE ip_version = 4",
			"198.18.0.10\t198.18.1.20\t::ffff:198.18.0.10\t::ffff:198.18.1.20\t1"},
		{"IPv6 row", "SELECT src_ip, dst_ip, toString(src_ip_bin), toString(dst_ip_bin), _shard_num FROM " + database + ".flows WHERE ip_version = 6",
			"fd00:10::a\tfd00:10:1::14\tfd00:10::a\tfd00:10:1::14\t1"},
		{"ingest_batch from the token (0008)", "SELECT DISTINCT ingest_batch = cityHash64('cluster-test-1') FROM " + database + ".flows", "1"},
		{"range filter on *_ip_bin", "SELECT count() FROM " + database + ".flows WHERE dst_ip_bin BETWEEN toIPv6('198.18.0.0') AND toIPv6('198.19.255.255')", "1"},
		{"rollup summed through Distributed", "SELECT ip_version, sum(records), sum(bytes), sum(reverse_bytes) FROM " + database + ".rollup_pod_to_pod_1m GROUP BY ip_version ORDER BY ip_version",
			"4\t1\t100\t10\n6\t1\t200\t20"},
		// The shapes of the API's /flows page reads (web/api pageBound and
		// flowsSQL) run over the Distributed table, virtual-row setting
		// included. (Their answers are checked in web/api.)
		{"flows page bound", "SELECT matched FROM (SELECT toUnixTimestamp(minOrNull(m)) AS bound, count() AS matched FROM (SELECT toStartOfMinute(flow_end) AS m FROM " + database +
			".flows WHERE src_pod_namespace = 'shop' ORDER BY m DESC LIMIT 3)) SETTINGS read_in_order_use_virtual_row = 1", "2"},
		{"flows page from its bound", "SELECT count() FROM (SELECT ip_version FROM " + database + ".flows WHERE src_pod_namespace = 'shop' AND toStartOfMinute(flow_end) >= fromUnixTimestamp64Milli(0, 'UTC')" +
			" ORDER BY toStartOfMinute(flow_end) DESC, flow_end DESC LIMIT 3)", "2"},
	}
	for _, tt := range tests {
		out, err := db.Query(ctx, tt.query, "TabSeparated")
		if err != nil || strings.TrimSpace(string(out)) != tt.want {
			t.Errorf("%s: got %q (%v), want %q", tt.name, out, err, tt.want)
		}
	}
	err = db.Exec(ctx, "INSERT INTO "+database+".traceflows (trace_id, started, family, outcome)"+settings+" VALUES ('tf-1', now64(3), 'ipv6', 'delivered')")
	if err != nil {
		t.Fatal(err)
	}
	if out, err := db.Query(ctx, "SELECT trace_id, family FROM "+database+".traceflows_local", "TabSeparated"); err != nil || string(out) != "tf-1\tipv6\n" {
		t.Errorf("traceflows through Distributed: %q %v", out, err)
	}
}
