package api

import (
	"context"
	"maps"
	"slices"
	"strings"

	"github.com/gin-gonic/gin"

	"github.com/dualflow/dualflow/internal/chsql"
)

// ServiceMap is the answer of GET /servicemap: nodes are workloads,
// Services and outside addresses; edges carry traffic per family and
// verdict.
type ServiceMap struct {
	Nodes []MapNode `json:"nodes"`
	Edges []MapEdge `json:"edges"`
}

// MapNode is a vertex of the map.
type MapNode struct {
	ID   string `json:"id"`
	Kind string `json:"kind"` // workload, service, external
	// Families lists the IP versions seen at this node.
	Families []int `json:"families"`
}

// MapEdge is traffic from one node to another over one family with one
// verdict class (allowed, dropped, unknown).
type MapEdge struct {
	Src       string `json:"src"`
	Dst       string `json:"dst"`
	IPVersion int    `json:"ip_version"`
	Verdict   string `json:"verdict"`
	Flows     uint64 `json:"flows"`
	Bytes     uint64 `json:"bytes"`
	// SrcNode and DstNode are the Kubernetes nodes of the ends (empty
	// outside the cluster), set with group=node: the edge is then one per
	// node pair too.
	SrcNode string `json:"src_node,omitempty"`
	DstNode string `json:"dst_node,omitempty"`
}

// maxEdges bounds the map; the heaviest edges are kept.
const maxEdges = 500

func (a *API) servicemap(c *gin.Context) (any, error) {
	q := c.Request.URL.Query()
	f, err := parseFilter(q, a.cfg.Now(), "limit", "group")
	if err != nil {
		return nil, err
	}
	f.scope = principalOf(c).scope
	// group=node splits each edge by the nodes of its ends (the map's
	// node grouping); the edge projections have no node, so such a map
	// reads the rows.
	keys, nodes := "src, dst, ip_version, verdict", ""
	switch q.Get("group") {
	case "":
	case "node":
		keys, nodes = keys+", src_node, dst_node", "src_node, dst_node, "
	default:
		return nil, &FieldError{Field: "group", Message: "group is node or absent"}
	}
	limit, err := intParam(q, "limit", maxEdges, 1, maxEdges)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(c.Request.Context(), a.cfg.QueryTimeout)
	defer cancel()
	// Summed per tier (whole hours and minutes from the projections
	// edges_1h and edges_1m, the edges as rows: tieredSQL).
	sql := chsql.Select{Cols: keys + ", sum(n) AS flows, sum(b) AS bytes", From: "(" + a.tieredSQL(f, true, func(string) string {
		return "src_label AS src, dst_label AS dst, ip_version, verdict_class AS verdict, " + nodes + "count() AS n, sum(bytes + reverse_bytes) AS b"
	}, keys) + ")", GroupBy: keys,
		OrderBy: "bytes DESC, flows DESC, " + keys, Limit: limit, Settings: jsonSettings}.String()
	m := &ServiceMap{Nodes: []MapNode{}, Edges: []MapEdge{}}
	if err := decodeRows(ctx, a, sql, &m.Edges); err != nil {
		return nil, err
	}
	m.Nodes = mapNodes(m.Edges)
	return m, nil
}

// ipVersions are the families of the flows table, in the answers' order.
var ipVersions = []int{4, 6}

func mapNodes(edges []MapEdge) []MapNode {
	fams := map[string][2]bool{} // node → seen over ipVersions
	for _, e := range edges {
		for _, id := range []string{e.Src, e.Dst} {
			f := fams[id]
			if i := slices.Index(ipVersions, e.IPVersion); i >= 0 {
				f[i] = true
			}
			fams[id] = f
		}
	}
	out := make([]MapNode, 0, len(fams))
	for _, id := range slices.Sorted(maps.Keys(fams)) {
		n := MapNode{ID: id, Kind: "external"}
		switch {
		case strings.HasPrefix(id, "svc:") && len(id) > 4:
			n.Kind = "service"
		case strings.Contains(id, "/"):
			n.Kind = "workload"
		}
		for i, v := range ipVersions {
			if fams[id][i] {
				n.Families = append(n.Families, v)
			}
		}
		out = append(out, n)
	}
	return out
}
