// Package webtest holds what web's tests, browser tests and benchmarks
// share: an embedded store seeded with a small dual-stack lab's flows, and
// fakes of the evaluator, tracer and auditor. Not for production use.
package webtest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/dualflow/dualflow/collector/store"
	"github.com/dualflow/dualflow/collector/store/chdb"
	"github.com/dualflow/dualflow/migrations"
)

// OpenStore opens an embedded store in dir and applies the migrations. It
// returns (nil, nil) when libchdb is missing and DUALFLOW_REQUIRE_CHDB is
// not 1, so callers skip. chDB allows one data directory per process.
func OpenStore(dir string) (*store.Embedded, error) {
	e, err := store.NewEmbedded(store.EmbeddedConfig{DataDir: dir})
	if errors.Is(err, chdb.ErrLibraryNotFound) && os.Getenv("DUALFLOW_REQUIRE_CHDB") != "1" {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	r, err := migrations.NewRunner(e, migrations.Options{})
	if err == nil {
		_, err = r.Up(context.Background())
	}
	if err != nil {
		e.Close()
		return nil, fmt.Errorf("migrate: %w", err)
	}
	return e, nil
}

// Workload is a lab workload; index w gives its addresses
// 198.18.w.k and fd00:10:244:w::k.
type Workload struct {
	Namespace, Name, Kind, Node string
}

// Lab is the seeded cluster.
var Lab = []Workload{
	{"shop", "frontend", "Deployment", "node-a"},
	{"shop", "cart", "Deployment", "node-b"},
	{"shop", "db", "StatefulSet", "node-b"},
	{"infra", "dns", "Deployment", "node-a"},
}

// Pairs are the seeded conversations (indices in Lab), with a service when
// the flow went through one, the port, and the verdicts per family:
// frontend → db is allowed over IPv4 and denied over IPv6 (a dual-stack
// gap), cart → db is IPv4 only.
var Pairs = []struct {
	Src, Dst           int
	Service            string
	Port               int
	Verdict4, Verdict6 string // "" means no traffic over that family
}{
	{0, 1, "cart", 8080, "allowed", "allowed"},
	{0, 2, "", 5432, "allowed", "denied"},
	{1, 2, "db", 5432, "allowed", ""},
	{0, 3, "dns", 53, "not_isolated", "not_isolated"},
	{1, 3, "dns", 53, "not_isolated", "not_isolated"},
}

func sqlArray(vals []string) string {
	q := make([]string, len(vals))
	for i, v := range vals {
		q[i] = "'" + v + "'"
	}
	return "[" + strings.Join(q, ", ") + "]"
}

// SeedSQL returns an INSERT ... SELECT FROM numbers(n) writing n flow rows
// spread evenly over span before now, alternating the families, cycling
// through Pairs (rows of a family a pair does not use are skipped, so
// slightly fewer than n rows land).
func SeedSQL(db string, n int, now time.Time, span time.Duration) string {
	var srcNS, srcName, srcKind, srcNode, dstNS, dstName, dstKind, dstNode, svc, v4, v6 []string
	var sw, dw, port []string
	for _, p := range Pairs {
		s, d := Lab[p.Src], Lab[p.Dst]
		srcNS, srcName, srcKind, srcNode = append(srcNS, s.Namespace), append(srcName, s.Name), append(srcKind, s.Kind), append(srcNode, s.Node)
		dstNS, dstName, dstKind, dstNode = append(dstNS, d.Namespace), append(dstName, d.Name), append(dstKind, d.Kind), append(dstNode, d.Node)
		svc = append(svc, p.Service)
		v4, v6 = append(v4, p.Verdict4), append(v6, p.Verdict6)
		sw, dw, port = append(sw, strconv.Itoa(p.Src+1)), append(dw, strconv.Itoa(p.Dst+1)), append(port, strconv.Itoa(p.Port))
	}
	np := len(Pairs)
	endMs := now.UnixMilli()
	spanMs := span.Milliseconds()
	return fmt.Sprintf(`INSERT INTO %[1]s.flows (flow_start, flow_end, time_received, ip_version, src_ip_in, dst_ip_in, src_port, dst_port, protocol,
 service_ip_in, service_port, packets, bytes, reverse_packets, reverse_bytes, packets_total, bytes_total, reverse_packets_total, reverse_bytes_total,
 end_reason, tcp_state, exporter_node, source,
 src_pod_namespace, src_pod_name, src_pod_labels, src_workload_kind, src_workload_name, src_node, src_zone,
 dst_pod_namespace, dst_pod_name, dst_pod_labels, dst_workload_kind, dst_workload_name, dst_node, dst_zone,
 dst_service_namespace, dst_service_name, flow_type, correlation,
 ingress_policy_namespace, ingress_policy_name, ingress_policy_rule, ingress_verdict, egress_verdict)
SELECT
 fromUnixTimestamp64Milli(toInt64(%[2]d - intDiv(number * %[3]d, %[4]d) - 5000), 'UTC') AS fs,
 fromUnixTimestamp64Milli(toInt64(%[2]d - intDiv(number * %[3]d, %[4]d)), 'UTC') AS fe,
 fe AS tr,
 if(number %% 2 = 0, 4, 6) AS v,
 if(v = 4, toIPv6(concat('::ffff:198.18.', toString(%[5]s[p]), '.', toString(k))), toIPv6(concat('fd00:10:244:', toString(%[5]s[p]), '::', hex(k)))),
 if(v = 4, toIPv6(concat('::ffff:198.18.', toString(%[6]s[p]), '.', toString(k + 100))), toIPv6(concat('fd00:10:244:', toString(%[6]s[p]), '::', hex(k + 100)))),
 toUInt16(32768 + number %% 20000), toUInt16(%[7]s[p]), if(%[7]s[p] = 53, 17, 6),
 if(%[8]s[p] = '', toIPv6('::'), if(v = 4, toIPv6(concat('::ffff:198.19.0.', toString(p))), toIPv6(concat('fd00:10:96::', toString(p))))),
 if(%[8]s[p] = '', 0, toUInt16(%[7]s[p])),
 10 + number %% 7, 1000 + (number %% 13) * 100, 8 + number %% 5, 2000 + (number %% 11) * 300,
 10, 1000, 8, 2000,
 'active_timeout', if(%[7]s[p] = 53, '', 'ESTABLISHED'), %[9]s[p], 'conntrack',
 %[10]s[p], concat(%[11]s[p], '-', toString(k %% 3)), map('app', %[11]s[p]), %[12]s[p], %[11]s[p], %[9]s[p], 'zone-1',
 %[13]s[p], concat(%[14]s[p], '-', toString(k %% 2)), map('app', %[14]s[p]), %[15]s[p], %[14]s[p], %[16]s[p], 'zone-1',
 if(%[8]s[p] = '', '', %[13]s[p]), %[8]s[p], if(%[9]s[p] = %[16]s[p], 'intra_node', 'inter_node'), 'merged',
 if(vd = 'denied', %[13]s[p], if(vd = 'allowed', %[13]s[p], '')), if(vd IN ('denied', 'allowed'), concat(%[14]s[p], '-policy'), ''), if(vd = 'allowed', 0, -1),
 vd, if(vd = 'denied', 'allowed', vd)
FROM (SELECT number, toUInt32(intDiv(number, 2) %% %[17]d + 1) AS p, toUInt32(1 + number %% 50) AS k,
       if(number %% 2 = 0, %[18]s[p], %[19]s[p]) AS vd FROM numbers(%[4]d))
WHERE vd != ''`,
		db, endMs, spanMs, n,
		"["+strings.Join(sw, ", ")+"]", "["+strings.Join(dw, ", ")+"]", "["+strings.Join(port, ", ")+"]",
		sqlArray(svc), sqlArray(srcNode), sqlArray(srcNS), sqlArray(srcName), sqlArray(srcKind),
		sqlArray(dstNS), sqlArray(dstName), sqlArray(dstKind), sqlArray(dstNode), np, sqlArray(v4), sqlArray(v6))
}
