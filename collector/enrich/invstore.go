package enrich

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/cache"

	"github.com/dualflow/dualflow/collector/enrich/inventory"
)

// objectStore holds the inventory's objects for the informers, as an API
// server would: every change gets the next resourceVersion and is kept in
// an event log, a list returns the objects of a kind at the current
// version, and a watch from a version replays the log's later events of
// its kind, then follows the new ones. A watch from a version the log no
// longer holds gets 410 Gone, and the informer lists again, like a
// compacted etcd. So the informers, transforms and handlers of a cluster
// run unchanged over the inventory files.
type objectStore struct {
	mu       sync.Mutex
	rv       uint64
	objects  map[objectKey]runtime.Object
	log      []storeEvent // the latest changes, oldest first
	watchers map[*storeWatch]struct{}
}

// maxStoreLog bounds the event log: inventory reloads are rare, so a
// watcher is never that far behind.
const maxStoreLog = 10_000

// storeEvent is one change of the store.
type storeEvent struct {
	rv  uint64
	gvr schema.GroupVersionResource
	ev  watch.Event
}

func newObjectStore() *objectStore {
	return &objectStore{objects: map[objectKey]runtime.Object{}, watchers: map[*storeWatch]struct{}{}}
}

// put creates or replaces the object of k (a copy, with the next
// resourceVersion), and tells the watchers of its kind.
func (s *objectStore) put(k objectKey, obj runtime.Object) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	obj = obj.DeepCopyObject()
	m, err := apimeta.Accessor(obj)
	if err != nil {
		return fmt.Errorf("inventory %s %s/%s: %w", k.gvr.Resource, k.namespace, k.name, err)
	}
	typ := watch.Added
	if _, had := s.objects[k]; had {
		typ = watch.Modified
	}
	s.rv++
	m.SetResourceVersion(strconv.FormatUint(s.rv, 10))
	s.objects[k] = obj
	s.record(storeEvent{rv: s.rv, gvr: k.gvr, ev: watch.Event{Type: typ, Object: obj}})
	return nil
}

// remove deletes the object of k, and tells the watchers of its kind.
func (s *objectStore) remove(k objectKey) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	obj, had := s.objects[k]
	if !had {
		return apierrors.NewNotFound(k.gvr.GroupResource(), k.name)
	}
	delete(s.objects, k)
	s.rv++
	obj = obj.DeepCopyObject()
	if m, err := apimeta.Accessor(obj); err == nil {
		m.SetResourceVersion(strconv.FormatUint(s.rv, 10))
	}
	s.record(storeEvent{rv: s.rv, gvr: k.gvr, ev: watch.Event{Type: watch.Deleted, Object: obj}})
	return nil
}

// record logs e and sends it to the watchers of its kind. A watcher whose
// buffer is full is ended: its informer watches again from the last
// version it saw, which the log replays.
func (s *objectStore) record(e storeEvent) {
	if len(s.log) >= maxStoreLog {
		s.log = append(s.log[:0], s.log[len(s.log)-maxStoreLog/2:]...)
	}
	s.log = append(s.log, e)
	for w := range s.watchers {
		if w.gvr != e.gvr {
			continue
		}
		select {
		case w.ch <- e.ev:
		default:
			s.stopLocked(w)
		}
	}
}

// list returns the objects of gvr in a list of the kind's list type, at
// the current resourceVersion.
func (s *objectStore) list(gvr schema.GroupVersionResource, gvk schema.GroupVersionKind) (runtime.Object, error) {
	l, err := scheme.Scheme.New(gvk.GroupVersion().WithKind(gvk.Kind + "List"))
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var items []runtime.Object
	for k, o := range s.objects {
		if k.gvr == gvr {
			items = append(items, o.DeepCopyObject())
		}
	}
	if err := apimeta.SetList(l, items); err != nil {
		return nil, err
	}
	lm, err := apimeta.ListAccessor(l)
	if err != nil {
		return nil, err
	}
	lm.SetResourceVersion(strconv.FormatUint(s.rv, 10))
	return l, nil
}

// watch follows gvr's changes after resourceVersion from ("" or "0": from
// now).
func (s *objectStore) watch(gvr schema.GroupVersionResource, from string) (watch.Interface, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var after uint64
	if from != "" && from != "0" {
		v, err := strconv.ParseUint(from, 10, 64)
		if err != nil {
			return nil, apierrors.NewBadRequest(fmt.Sprintf("resourceVersion %q: %v", from, err))
		}
		after = v
	} else {
		after = s.rv
	}
	if after > s.rv {
		return nil, apierrors.NewBadRequest(fmt.Sprintf("resourceVersion %d is in the future (now %d)", after, s.rv))
	}
	if len(s.log) > 0 && after+1 < s.log[0].rv || len(s.log) == 0 && after < s.rv {
		return nil, apierrors.NewResourceExpired(fmt.Sprintf("resourceVersion %d is older than the inventory's event log", after))
	}
	var backlog []watch.Event
	for _, e := range s.log {
		if e.rv > after && e.gvr == gvr {
			backlog = append(backlog, e.ev)
		}
	}
	w := &storeWatch{s: s, gvr: gvr, ch: make(chan watch.Event, len(backlog)+1024)}
	for _, ev := range backlog {
		w.ch <- ev
	}
	s.watchers[w] = struct{}{}
	return w, nil
}

func (s *objectStore) stopLocked(w *storeWatch) {
	if _, ok := s.watchers[w]; ok {
		delete(s.watchers, w)
		close(w.ch)
	}
}

// storeWatch is a watch of one kind of the store.
type storeWatch struct {
	s   *objectStore
	gvr schema.GroupVersionResource
	ch  chan watch.Event
}

func (w *storeWatch) Stop() {
	w.s.mu.Lock()
	defer w.s.mu.Unlock()
	w.s.stopLocked(w)
}

func (w *storeWatch) ResultChan() <-chan watch.Event { return w.ch }

// storeListWatch lists and watches one kind of a store for an informer.
type storeListWatch struct {
	s   *objectStore
	gvr schema.GroupVersionResource
	gvk schema.GroupVersionKind
}

func (lw storeListWatch) List(o metav1.ListOptions) (runtime.Object, error) {
	return lw.ListWithContext(context.Background(), o)
}

func (lw storeListWatch) Watch(o metav1.ListOptions) (watch.Interface, error) {
	return lw.WatchWithContext(context.Background(), o)
}

func (lw storeListWatch) ListWithContext(_ context.Context, _ metav1.ListOptions) (runtime.Object, error) {
	return lw.s.list(lw.gvr, lw.gvk)
}

func (lw storeListWatch) WatchWithContext(_ context.Context, o metav1.ListOptions) (watch.Interface, error) {
	return lw.s.watch(lw.gvr, o.ResourceVersion)
}

// IsWatchListSemanticsUnSupported: the informer lists, then watches (the
// store does not stream its initial list as watch events).
func (storeListWatch) IsWatchListSemanticsUnSupported() bool { return true }

// informers returns an informer per inventory kind, named as
// Enricher.informers names them.
func (s *objectStore) informers() []watched {
	out := make([]watched, 0, len(inventory.Kinds))
	for _, gvk := range inventory.Kinds {
		gvr := kindResources[gvk.Kind]
		obj, err := scheme.Scheme.New(gvk)
		if err != nil {
			panic(fmt.Sprintf("enrich: inventory kind %v: %v", gvk, err)) // inventory.Kinds are client-go's
		}
		lw := storeListWatch{s: s, gvr: gvr, gvk: gvk}
		out = append(out, watched{kind: strings.ToLower(gvk.Kind), informer: cache.NewSharedIndexInformer(lw, obj, 0, cache.Indexers{})})
	}
	return out
}
