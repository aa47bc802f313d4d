package api

import (
	"fmt"
	"maps"
	"net/netip"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/dualflow/dualflow/collector/audit"
	"github.com/dualflow/dualflow/flow"
	"github.com/dualflow/dualflow/internal/chsql"
)

// FieldError is a bad request about one input field. Handlers answer it
// with 400 and {"message", "field"}.
type FieldError struct {
	Field   string
	Message string
	// reason labels dualflow_web_bad_requests_total; empty is
	// reasonInvalid.
	reason string
}

// Reasons of dualflow_web_bad_requests_total.
const (
	reasonInvalid      = "invalid"       // a value out of its domain
	reasonBadJSON      = "bad_json"      // a body that is not the JSON wanted
	reasonUnknownField = "unknown_field" // a body field the request has not
	reasonQuery        = "query"         // SQL or a filter the engine refused
)

func (e *FieldError) Error() string { return e.Field + ": " + e.Message }

func fieldErr(field, format string, args ...any) *FieldError {
	return &FieldError{Field: field, Message: fmt.Sprintf(format, args...)}
}

// A flow filter follows Hubble: every field given is AND-ed, the values of
// one field (repeated parameters or comma-separated) are OR-ed, and
// "not.<field>" excludes what the field would match. Each field compiles a
// value into a condition on the flows table.
type fieldSpec struct {
	doc   string
	build func(v string) (string, error)
}

// Sides of a flow. A field without src_/dst_ matches either side.
var sides = []string{"src", "dst"}

var filterFields = map[string]fieldSpec{}

func init() { buildFilterFields() }

func buildFilterFields() {
	add := func(name, doc string, f func(v string) (string, error)) {
		filterFields[name] = fieldSpec{doc: doc, build: f}
	}
	both := func(name, doc string, f func(side, v string) (string, error)) {
		for _, s := range sides {
			s := s
			add(s+"_"+name, doc+" ("+map[string]string{"src": "source", "dst": "destination"}[s]+")", func(v string) (string, error) { return f(s, v) })
		}
		add(name, doc+" (either side)", func(v string) (string, error) {
			a, err := f("src", v)
			if err != nil {
				return "", err
			}
			b, err := f("dst", v)
			if err != nil {
				return "", err
			}
			return chsql.Or(a, b), nil
		})
	}
	add("ip_version", "4 or 6 (or ipv4, ipv6)", func(v string) (string, error) {
		switch f, err := flow.ParseFamily(v); {
		case err != nil:
			return "", err
		case f == 0:
			return "", fmt.Errorf("ip_version %q: want 4 or 6 (leave it out for both)", v)
		default:
			return fmt.Sprintf("ip_version = %d", f), nil
		}
	})
	both("pod", "pod as namespace/name or name", func(s, v string) (string, error) {
		ns, name, err := splitNS("pod", v)
		return nsName(s+"_pod_namespace", s+"_pod_name", ns, name), err
	})
	both("namespace", "pod namespace", func(s, v string) (string, error) {
		if v == "" {
			return "", fmt.Errorf("empty namespace")
		}
		return chsql.Eq(s+"_pod_namespace", v), nil
	})
	both("workload", "workload as namespace/name, name, or Kind:namespace/name", func(s, v string) (string, error) {
		kind := ""
		if k, rest, ok := strings.Cut(v, ":"); ok {
			kind, v = k, rest
		}
		ns, name, err := splitNS("workload", v)
		if err != nil {
			return "", err
		}
		c := []string{chsql.Eq(s+"_workload_name", name)}
		if ns != "" {
			c = append(c, chsql.Eq(s+"_pod_namespace", ns))
		}
		if kind != "" {
			c = append(c, chsql.Eq(s+"_workload_kind", kind))
		}
		return chsql.And(c...), nil
	})
	both("label", "label selector term: key=value, key!=value, key or !key", func(s, v string) (string, error) {
		return labelCond(s+"_pod_labels", v)
	})
	both("node", "node name", func(s, v string) (string, error) {
		if v == "" {
			return "", fmt.Errorf("empty node")
		}
		return chsql.Eq(s+"_node", v), nil
	})
	both("zone", "topology zone", func(s, v string) (string, error) {
		return chsql.Eq(s+"_zone", v), nil
	})
	both("ip", "address or CIDR of either family", func(s, v string) (string, error) {
		return ipCond(s+"_ip_bin", v)
	})
	both("port", "port or range lo-hi", func(s, v string) (string, error) {
		return portCond(s+"_port", v)
	})
	add("service", "destination Service as namespace/name or name", func(v string) (string, error) {
		ns, name, err := splitNS("service", v)
		return nsName("dst_service_namespace", "dst_service_name", ns, name), err
	})
	add("dst_service", filterFieldsDocAlias, func(v string) (string, error) { return filterFields["service"].build(v) })
	add("protocol", "TCP, UDP, ICMP, ICMPv6, SCTP or an IANA number", func(v string) (string, error) {
		n, err := audit.ParseProto(v)
		return "protocol = " + strconv.Itoa(int(n)), err
	})
	add("verdict", "policy verdict of either direction: allowed, denied, rejected, not_isolated, unknown; or dropped (denied or rejected)", func(v string) (string, error) {
		switch v {
		case "allowed", "denied", "rejected", "not_isolated", "unknown":
			if v == "unknown" {
				return "(ingress_verdict = 'unknown' AND egress_verdict = 'unknown')", nil
			}
			return chsql.Or(chsql.Eq("ingress_verdict", v), chsql.Eq("egress_verdict", v)), nil
		case "dropped":
			return droppedExpr, nil
		}
		return "", fmt.Errorf("unknown verdict %q", v)
	})
	add("policy", "deciding NetworkPolicy (either direction) as namespace/name or name", func(v string) (string, error) {
		ns, name, err := splitNS("policy", v)
		return chsql.Or(nsName("ingress_policy_namespace", "ingress_policy_name", ns, name),
			nsName("egress_policy_namespace", "egress_policy_name", ns, name)), err
	})
	boolean := func(col, doc string) {
		add(col, doc, func(v string) (string, error) {
			switch v {
			case "true", "1":
				return col, nil
			case "false", "0":
				return "NOT " + col, nil
			}
			return "", fmt.Errorf("want true or false")
		})
	}
	boolean("verdict_mismatch", "true: the datapath's verdict disagrees with the evaluated one")
	add(probesParam, "traceflow probes' rows: exclude (the default: a trace is not traffic), include, or only", nil)
	add("probe_trace_id", "the rows of the traceflow probe of this trace id (tf-…); without probes=, implies probes=include", func(v string) (string, error) {
		return chsql.Eq("probe_trace_id", v), nil
	})
	boolean("k8s_view_stale", "true: enriched while the collector's view of the Kubernetes API was stale (names may be out of date)")
}

const filterFieldsDocAlias = "alias of service"

// nsName matches name on nameCol, and ns on nsCol unless empty.
func nsName(nsCol, nameCol, ns, name string) string {
	if ns == "" {
		return chsql.Eq(nameCol, name)
	}
	return chsql.And(chsql.Eq(nsCol, ns), chsql.Eq(nameCol, name))
}

// splitNS splits "ns/name" ("name" alone has no namespace); an empty
// name is an error naming what.
func splitNS(what, v string) (ns, name string, err error) {
	ns, name, ok := strings.Cut(v, "/")
	if !ok {
		ns, name = "", v
	}
	if name == "" {
		err = fmt.Errorf("empty %s name", what)
	}
	return ns, name, err
}

func labelCond(col, v string) (string, error) {
	switch {
	case v == "":
		return "", fmt.Errorf("empty label selector")
	case strings.Contains(v, "!="):
		k, val, _ := strings.Cut(v, "!=")
		return col + "[" + chsql.String(strings.TrimSpace(k)) + "] != " + chsql.String(strings.TrimSpace(val)), nil
	case strings.Contains(v, "="):
		k, val, _ := strings.Cut(v, "=")
		val = strings.TrimPrefix(val, "=")
		return col + "[" + chsql.String(strings.TrimSpace(k)) + "] = " + chsql.String(strings.TrimSpace(val)), nil
	case strings.HasPrefix(v, "!"):
		return "NOT mapContains(" + col + ", " + chsql.String(strings.TrimSpace(v[1:])) + ")", nil
	}
	return "mapContains(" + col + ", " + chsql.String(strings.TrimSpace(v)) + ")", nil
}

// ipCond matches an address or a CIDR on a *_ip_bin column (IPv6, IPv4
// mapped), which is indexed and cheaper than text compares.
func ipCond(col, v string) (string, error) {
	if strings.Contains(v, "/") {
		p, err := netip.ParsePrefix(v)
		if err != nil {
			return "", fmt.Errorf("bad CIDR %q", v)
		}
		if p.Addr().Is4In6() {
			p = netip.PrefixFrom(p.Addr().Unmap(), max(p.Bits()-96, 0))
		}
		p = p.Masked()
		return col + " BETWEEN " + chsql.IPv6(p.Addr()) + " AND " + chsql.IPv6(lastAddr(p)), nil
	}
	a, err := netip.ParseAddr(v)
	if err != nil {
		return "", fmt.Errorf("bad address %q", v)
	}
	if a.Zone() != "" {
		return "", fmt.Errorf("address %q has a zone", v)
	}
	return col + " = " + chsql.IPv6(a), nil
}

// lastAddr is the highest address of the masked prefix p.
func lastAddr(p netip.Prefix) netip.Addr {
	b := p.Addr().AsSlice()
	for i := p.Bits(); i < len(b)*8; i++ {
		b[i/8] |= 0x80 >> (i % 8)
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}

func portCond(col, v string) (string, error) {
	if lo, hi, ok := strings.Cut(v, "-"); ok {
		l, err1 := strconv.ParseUint(lo, 10, 16)
		h, err2 := strconv.ParseUint(hi, 10, 16)
		if err1 != nil || err2 != nil || l > h {
			return "", fmt.Errorf("bad port range %q", v)
		}
		return col + " BETWEEN " + strconv.FormatUint(l, 10) + " AND " + strconv.FormatUint(h, 10), nil
	}
	p, err := strconv.ParseUint(v, 10, 16)
	if err != nil {
		return "", fmt.Errorf("bad port %q", v)
	}
	return col + " = " + strconv.FormatUint(p, 10), nil
}

// Filter is a parsed flow filter.
type Filter struct {
	Since, Until time.Time
	// probes says what becomes of the rows of traceflow probes (migration
	// 0012); the zero value leaves them out.
	probes probeMode
	// conds are the SQL conditions, already AND-able.
	conds []string
	// scope, when not nil, limits the reads to these namespaces (the
	// request's Principal.scope; see scopedSource).
	scope []string
}

// probeMode is the probes parameter: what a filter does with the rows
// of traceflow probes (is_probe). A trace sends a real packet, which the
// exporters report as a flow: it is not traffic, so every reader of flows
// leaves it out unless asked.
type probeMode uint8

const (
	probesExclude probeMode = iota // the default
	probesInclude
	probesOnly
)

// probesParam is the parameter that sets a filter's probeMode.
const probesParam = "probes"

var probeModes = map[string]probeMode{"exclude": probesExclude, "include": probesInclude, "only": probesOnly}

// allConds is the filter's conditions, the probes' first.
func (f *Filter) allConds() []string {
	switch f.probes {
	case probesInclude:
		return f.conds
	case probesOnly:
		return append([]string{"is_probe"}, f.conds...)
	}
	return append([]string{"NOT is_probe"}, f.conds...)
}

// Default time window and filter bounds. A filter past a bound is a 400
// naming the field: the engine refuses a query text over max_query_size
// (256 KiB by default) as a syntax error, which would otherwise surface as
// a store failure (502).
const (
	defaultWindow = time.Hour
	maxValues     = 64 // values per field
	// maxValueBytes bounds one value: Kubernetes names are at most 253
	// bytes, label keys 317 and values 63.
	maxValueBytes = 1024
	// maxFilterSQL bounds the conditions' SQL text, which with the largest
	// query around them (under 4 KiB) stays well within max_query_size.
	// A field's value can appear up to four times in it (policy).
	maxFilterSQL = 64 << 10
)

// parseFilter reads a filter from query parameters. Unknown parameters in
// skip are ignored (pagination, follow, ...); any other unknown one is a
// FieldError, so a typo does not silently widen the result.
func parseFilter(q url.Values, now time.Time, skip ...string) (*Filter, error) {
	f := &Filter{}
	var err error
	if f.Since, f.Until, err = parseWindow(q, now, defaultWindow); err != nil {
		return nil, err
	}
	size := 0 // bytes of f.conds
	probes, trace := q.Has(probesParam), false
	for _, k := range slices.Sorted(maps.Keys(q)) {
		if k == "since" || k == "until" || slices.Contains(skip, k) {
			continue
		}
		if k == probesParam || k == "not."+probesParam {
			v := q.Get(k)
			m, ok := probeModes[v]
			if !ok || k != probesParam || len(q[k]) > 1 {
				return nil, fieldErr(k, "want probes=exclude, include or only, got %q", strings.Join(q[k], ","))
			}
			f.probes = m
			continue
		}
		if k == "probe_trace_id" {
			trace = true
		}
		name, neg := k, false
		if n, ok := strings.CutPrefix(k, "not."); ok {
			name, neg = n, true
		}
		spec, ok := filterFields[name]
		if !ok {
			return nil, fieldErr(k, "unknown filter field")
		}
		var vals []string
		for _, raw := range q[k] {
			for _, v := range strings.Split(raw, ",") {
				if v = strings.TrimSpace(v); v != "" {
					vals = append(vals, v)
				}
			}
		}
		if len(vals) == 0 {
			continue
		}
		if len(vals) > maxValues {
			return nil, fieldErr(k, "at most %d values", maxValues)
		}
		ors := make([]string, 0, len(vals))
		for _, v := range vals {
			if len(v) > maxValueBytes {
				return nil, fieldErr(k, "a value is %d bytes long; at most %d", len(v), maxValueBytes)
			}
			c, err := spec.build(v)
			if err != nil {
				return nil, fieldErr(k, "%v", err)
			}
			ors = append(ors, c)
		}
		c := "(" + strings.Join(ors, " OR ") + ")"
		if neg {
			c = "NOT " + c
		}
		if size += len(c); size > maxFilterSQL {
			return nil, fieldErr(k, "the filter is too large (over %d KiB as SQL): use fewer or shorter values", maxFilterSQL>>10)
		}
		f.conds = append(f.conds, c)
	}
	if trace && !probes {
		f.probes = probesInclude // asked for a trace's rows
	}
	return f, nil
}

// where is the conditions, time range first (the table's order key).
func (f *Filter) where() []string {
	return append([]string{chsql.FlowEnd(f.Since, f.Until)}, f.allConds()...)
}

// parseWindow reads the since and until parameters of every route with a
// time window: since defaults to def back from now, until to now.
func parseWindow(q url.Values, now time.Time, def time.Duration) (since, until time.Time, err error) {
	since, until = now.Add(-def), now
	if v := q.Get("since"); v != "" {
		if since, err = parseTime(v, now); err != nil {
			return since, until, fieldErr("since", "%v", err)
		}
	}
	if v := q.Get("until"); v != "" {
		if until, err = parseTime(v, now); err != nil {
			return since, until, fieldErr("until", "%v", err)
		}
	}
	if !until.After(since) {
		return since, until, fieldErr("since", "since must be before until")
	}
	return since, until, nil
}

// intParam reads the integer parameter name of q: def when absent, else
// within lo..hi.
func intParam(q url.Values, name string, def, lo, hi int) (int, error) {
	v := q.Get(name)
	if v == "" {
		return def, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < lo || n > hi {
		return 0, fieldErr(name, "want %d..%d, not %q", lo, hi, v)
	}
	return n, nil
}

// parseTime accepts RFC 3339, Unix milliseconds, or a duration before now
// ("15m", "2h").
func parseTime(v string, now time.Time) (time.Time, error) {
	if d, err := time.ParseDuration(v); err == nil {
		if d < 0 {
			d = -d
		}
		return now.Add(-d), nil
	}
	if t, err := time.Parse(time.RFC3339Nano, v); err == nil {
		return t, nil
	}
	if ms, err := strconv.ParseInt(v, 10, 64); err == nil && ms > 0 {
		return time.UnixMilli(ms), nil
	}
	return time.Time{}, fmt.Errorf("want RFC 3339, Unix milliseconds or a duration like 15m, got %q", v)
}
