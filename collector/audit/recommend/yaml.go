package recommend

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"

	yamlv3 "go.yaml.in/yaml/v3"
)

// commentWidth is where comments wrap.
const commentWidth = 100

// YAML renders the recommendation as a multi-document stream that
// kubectl apply takes: each policy in its JSON form (the API's field
// names and order, map keys sorted), its note as a comment above it, and
// each rule's comment above the rule. The recommendation's notes open the stream. The same
// recommendation gives the same bytes.
func (r *Recommendation) YAML() ([]byte, error) {
	y, _, err := r.render()
	return y, err
}

// render returns YAML's stream and each policy's document in it (after
// its "---" line), rendered once.
func (r *Recommendation) render() ([]byte, [][]byte, error) {
	var out bytes.Buffer
	head := []string{fmt.Sprintf("NetworkPolicies recommended by dualflow (%s) for %s.", r.Mode, r.Scope)}
	head = append(head, r.Notes...)
	writeComment(&out, "", strings.Join(head, "\n"))
	docs := make([][]byte, len(r.Policies))
	for i := range r.Policies {
		p := &r.Policies[i]
		doc, err := policyNode(p)
		if err != nil {
			return nil, nil, fmt.Errorf("policy %s/%s: %w", p.Policy.Namespace, p.Policy.Name, err)
		}
		b, err := encodeNode(doc)
		if err != nil {
			return nil, nil, fmt.Errorf("policy %s/%s: %w", p.Policy.Namespace, p.Policy.Name, err)
		}
		out.WriteString("---\n")
		out.Write(b)
		docs[i] = b
	}
	return out.Bytes(), docs, nil
}

// encodeNode writes a policy's document in the recommendation's style.
func encodeNode(doc *yamlv3.Node) ([]byte, error) {
	var b bytes.Buffer
	enc := yamlv3.NewEncoder(&b)
	enc.SetIndent(2)
	enc.CompactSeqIndent()
	if err := enc.Encode(doc); err != nil {
		return nil, err
	}
	if err := enc.Close(); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// policyNode is p as a YAML node with its comments: its JSON (which is
// YAML) read as nodes and written in block style. (Through
// sigs.k8s.io/yaml, JSON to YAML and YAML to nodes took twice as long
// for the large scope's 4,000 policies.)
func policyNode(p *Policy) (*yamlv3.Node, error) {
	b, err := json.Marshal(p.Policy)
	if err != nil {
		return nil, err
	}
	var doc yamlv3.Node
	if err := yamlv3.Unmarshal(b, &doc); err != nil {
		return nil, err
	}
	blockStyle(&doc)
	root := doc.Content[0]
	root.HeadComment = wrap(p.Note)
	spec := child(root, "spec")
	for _, d := range []struct {
		key      string
		comments []string
	}{{"ingress", p.Ingress}, {"egress", p.Egress}} {
		seq := child(spec, d.key)
		if seq == nil {
			continue
		}
		for i, rule := range seq.Content {
			if i < len(d.comments) && d.comments[i] != "" {
				rule.HeadComment = wrap(d.comments[i])
			}
		}
	}
	return &doc, nil
}

// blockStyle clears the flow and quoting styles JSON gave n and its
// children: the encoder writes block style, and quotes a string only
// where YAML would read it as another type.
func blockStyle(n *yamlv3.Node) {
	n.Style = 0
	for _, c := range n.Content {
		blockStyle(c)
	}
}

// child returns the value of key in mapping m, nil if none.
func child(m *yamlv3.Node, key string) *yamlv3.Node {
	if m == nil || m.Kind != yamlv3.MappingNode {
		return nil
	}
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == key {
			return m.Content[i+1]
		}
	}
	return nil
}

// wrap wraps text into "# " lines of at most commentWidth characters
// (a word longer than that stays whole); each "\n" starts a new line.
func wrap(text string) string {
	var lines []string
	for _, para := range strings.Split(text, "\n") {
		cur := ""
		for _, w := range strings.Fields(para) {
			if cur != "" && len(cur)+1+len(w) > commentWidth {
				lines = append(lines, cur)
				cur = ""
			}
			if cur != "" {
				cur += " "
			}
			cur += w
		}
		if cur != "" {
			lines = append(lines, cur)
		}
	}
	for i := range lines {
		lines[i] = "# " + lines[i]
	}
	return strings.Join(lines, "\n")
}

func writeComment(b *bytes.Buffer, indent, text string) {
	for _, l := range strings.Split(wrap(text), "\n") {
		if l != "" {
			b.WriteString(indent + l + "\n")
		}
	}
}
