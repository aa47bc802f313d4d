package ovs

import (
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"os"
	"strconv"
	"strings"
)

// Cookie layout. Every flow a dualflow-aware datapath installs carries a
// cookie that says what the flow is for, so that `ovs-ofctl dump-flows`
// statistics can be read back per NetworkPolicy rule:
//
//	bits 63..56  CookieMagic (0xdf): a dualflow flow
//	bits 55..48  Kind
//	bits 47..32  zero
//	bits 31..0   ID: RuleID(name) for allow and drop rules, a small
//	             constant for the other kinds
//
// IDs are a hash of the rule name (nft.RuleName / nft.DropName in the lab),
// so they are the same on every node and survive a reload; the rules file
// (see Rules) maps them back to names. The same 32-bit IDs are stored in
// ct_label when a connection is committed: bits 0..31 hold the ingress
// rule that allowed it, bits 32..63 the egress rule (0: not isolated).
const CookieMagic = 0xdf

// Kind is what a flow is for (cookie bits 55..48).
type Kind uint8

// Flow kinds.
const (
	KindPipeline Kind = 1 // classification, conntrack, forwarding
	KindAllow    Kind = 2 // one NetworkPolicy rule's allow flow
	KindDrop     Kind = 3 // an isolated pod's default-deny drop flow
	KindService  Kind = 4 // Service load balancing (ct(nat))
	KindConn     Kind = 5 // learned per-connection counter flow
	KindNeighbor Kind = 6 // ARP and neighbour discovery responders
)

var kindNames = map[Kind]string{KindPipeline: "pipeline", KindAllow: "allow", KindDrop: "drop",
	KindService: "service", KindConn: "conn", KindNeighbor: "neighbor"}

// String returns the kind's name ("allow", "drop", …).
func (k Kind) String() string {
	if s, ok := kindNames[k]; ok {
		return s
	}
	return "kind" + strconv.Itoa(int(k))
}

// MarshalText encodes the kind by name.
func (k Kind) MarshalText() ([]byte, error) { return []byte(k.String()), nil }

// UnmarshalText decodes a kind name.
func (k *Kind) UnmarshalText(b []byte) error {
	for v, s := range kindNames {
		if s == string(b) {
			*k = v
			return nil
		}
	}
	return fmt.Errorf("unknown flow kind %q", b)
}

// Cookie returns the cookie of a flow of kind k with id.
func Cookie(k Kind, id uint32) uint64 {
	return uint64(CookieMagic)<<56 | uint64(k)<<48 | uint64(id)
}

// KindMask is the cookie mask that selects one kind in
// `ovs-ofctl dump-flows br cookie=Cookie(k,0)/KindMask`.
const KindMask uint64 = 0xffff_0000_0000_0000

// SplitCookie returns the kind and id of a dualflow cookie; ok is false
// for a cookie without CookieMagic.
func SplitCookie(c uint64) (k Kind, id uint32, ok bool) {
	if c>>56 != CookieMagic || c>>32&0xffff != 0 {
		return 0, 0, false
	}
	return Kind(c >> 48), uint32(c), true
}

// RuleID returns the 32-bit ID of a rule name: FNV-32a. 0 is reserved
// for "no rule" and maps to 1.
func RuleID(name string) uint32 {
	h := fnv.New32a()
	h.Write([]byte(name))
	if v := h.Sum32(); v != 0 {
		return v
	}
	return 1
}

// ct_mark bits set by a dualflow datapath.
const (
	// MarkAllowed is set when the node's policy allowed the connection
	// and committed it; a connection without it was only DNAT-ed.
	MarkAllowed uint32 = 0x1
)

// Rule is one NetworkPolicy rule, or one isolated pod's drop rule, as the
// datapath installed it.
type Rule struct {
	ID   uint32 `json:"id"`
	Kind Kind   `json:"kind"` // KindAllow or KindDrop
	// Name is the rule's name: "ns/policy/ingress/0" for a policy rule,
	// "drop/ingress/ns/pod" for a drop rule.
	Name      string `json:"name"`
	Namespace string `json:"namespace"`
	Policy    string `json:"policy,omitempty"` // allow rules
	Pod       string `json:"pod,omitempty"`    // drop rules
	Direction string `json:"direction"`        // ingress or egress
	Index     int    `json:"index"`            // rule index in the policy; -1 for drop rules
}

// Rules maps rule IDs back to rules. The zero value is empty; a nil *Rules
// is empty too.
type Rules struct {
	byID map[uint32]Rule
}

// rulesFile is the JSON document of a rules file.
type rulesFile struct {
	Rules []Rule `json:"rules"`
}

// NewRules indexes rules by ID. Two different names with one ID (a hash
// collision) are an error: the datapath must not install them.
func NewRules(rules []Rule) (*Rules, error) {
	r := &Rules{byID: make(map[uint32]Rule, len(rules))}
	for _, x := range rules {
		if x.ID == 0 {
			return nil, fmt.Errorf("rule %q: id 0 is reserved", x.Name)
		}
		if old, ok := r.byID[x.ID]; ok && old.Name != x.Name {
			return nil, fmt.Errorf("rules %q and %q share id %#x", old.Name, x.Name, x.ID)
		}
		r.byID[x.ID] = x
	}
	return r, nil
}

// Lookup returns the rule with id.
func (r *Rules) Lookup(id uint32) (Rule, bool) {
	if r == nil {
		return Rule{}, false
	}
	x, ok := r.byID[id]
	return x, ok
}

// Len returns the number of rules.
func (r *Rules) Len() int {
	if r == nil {
		return 0
	}
	return len(r.byID)
}

// ParseRules decodes a rules file.
func ParseRules(b []byte) (*Rules, error) {
	var f rulesFile
	if err := json.Unmarshal(b, &f); err != nil {
		return nil, fmt.Errorf("rules file: %w", err)
	}
	return NewRules(f.Rules)
}

// LoadRules reads the rules file at path.
func LoadRules(path string) (*Rules, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("rules file: %w", err)
	}
	return ParseRules(b)
}

// WriteRules writes rules to path atomically (temporary file + rename), so
// a reader never sees half a file.
func WriteRules(path string, rules []Rule) error {
	if _, err := NewRules(rules); err != nil {
		return err
	}
	b, err := json.MarshalIndent(rulesFile{Rules: rules}, "", "  ")
	if err != nil {
		return fmt.Errorf("rules file: %w", err)
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("rules file: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return errors.Join(fmt.Errorf("rules file: %w", err), os.Remove(tmp))
	}
	return nil
}

// ReportedName returns the name a record or a trace reports for rule id:
// the rule's name, or "rule-id:0x…" when the rules file does not know it.
func (r *Rules) ReportedName(id uint32) string {
	if x, ok := r.Lookup(id); ok {
		return x.Name
	}
	return "rule-id:0x" + strings.ToLower(strconv.FormatUint(uint64(id), 16))
}
