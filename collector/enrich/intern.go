package enrich

import (
	"maps"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"weak"
)

// interner shares the parts of objects that repeat: label sets (every
// replica of a ReplicaSet has the same labels), container port lists,
// namespace and node names. Label sets and port lists are held weakly, so
// that a set no object uses any more is freed (pods of finished Jobs carry
// unique labels); names are few and kept. Safe for concurrent use: the
// informers' transforms run on one goroutine per kind.
type interner struct {
	mu     sync.Mutex
	names  map[string]string
	labels map[string]weak.Pointer[map[string]string]
	ports  map[string]weak.Pointer[[]ContainerPort]
}

func newInterner() *interner {
	return &interner{
		names:  map[string]string{},
		labels: map[string]weak.Pointer[map[string]string]{},
		ports:  map[string]weak.Pointer[[]ContainerPort]{},
	}
}

// name returns the shared copy of s. Use it for names with few distinct
// values (namespaces, nodes, zones), never for unique ones.
func (in *interner) name(s string) string {
	if s == "" {
		return ""
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.nameLocked(s)
}

// labelSet returns a pointer to a shared map equal to m (nil for an empty
// one). The set lives as long as someone holds the pointer: keep it beside
// the map (holding the map alone does not keep the entry).
func (in *interner) labelSet(m map[string]string) *map[string]string {
	if len(m) == 0 {
		return nil
	}
	var b strings.Builder
	for _, k := range slices.Sorted(maps.Keys(m)) {
		// Length-prefixed, so that no two sets share a key.
		b.WriteString(strconv.Itoa(len(k)))
		b.WriteByte(':')
		b.WriteString(k)
		b.WriteString(strconv.Itoa(len(m[k])))
		b.WriteByte(':')
		b.WriteString(m[k])
	}
	return share(in, in.labels, b.String(), func() *map[string]string {
		c := make(map[string]string, len(m))
		for k, v := range m {
			c[in.nameLocked(k)] = v
		}
		return &c
	})
}

// portList returns a pointer to a shared slice equal to ps (nil for an
// empty one); like labelSet, keep the pointer.
func (in *interner) portList(ps []ContainerPort) *[]ContainerPort {
	if len(ps) == 0 {
		return nil
	}
	var b strings.Builder
	for _, p := range ps {
		b.WriteString(p.Name)
		b.WriteByte('/')
		b.WriteString(strconv.Itoa(int(p.Port)))
		b.WriteByte('/')
		b.WriteString(string(p.Protocol))
		b.WriteByte(',')
	}
	return share(in, in.ports, b.String(), func() *[]ContainerPort {
		c := slices.Clone(ps)
		return &c
	})
}

// share returns the value held in m under key, or else the one mk makes
// (called with in.mu held), held weakly: its entry goes when nothing else
// holds it.
func share[T any](in *interner, m map[string]weak.Pointer[T], key string, mk func() *T) *T {
	in.mu.Lock()
	defer in.mu.Unlock()
	if p := m[key].Value(); p != nil {
		return p
	}
	p := mk()
	m[key] = weak.Make(p)
	runtime.AddCleanup(p, func(key string) {
		in.mu.Lock()
		defer in.mu.Unlock()
		if m[key].Value() == nil {
			delete(m, key)
		}
	}, key)
	return p
}

// nameLocked is name with in.mu held. Label keys are few: interned.
func (in *interner) nameLocked(s string) string {
	if v, ok := in.names[s]; ok {
		return v
	}
	s = strings.Clone(s)
	in.names[s] = s
	return s
}
