package enrich

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
)

func storePod(name, ip string) (objectKey, *corev1.Pod) {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name}, Status: corev1.PodStatus{PodIP: ip}}
	return objectKey{gvr: kindResources["Pod"], namespace: "ns", name: name}, p
}

// TestObjectStoreListWatch: a list is at the current version; a watch
// from a version replays the later events of its kind only, then follows;
// a version older than the event log is 410 Gone, a future one refused.
func TestObjectStoreListWatch(t *testing.T) {
	s := newObjectStore()
	k1, p1 := storePod("a", "198.18.0.1")
	if err := s.put(k1, p1); err != nil {
		t.Fatal(err)
	}
	nsKey := objectKey{gvr: kindResources["Namespace"], name: "ns"}
	if err := s.put(nsKey, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "ns"}}); err != nil {
		t.Fatal(err)
	}
	lw := storeListWatch{s: s, gvr: kindResources["Pod"], gvk: corev1.SchemeGroupVersion.WithKind("Pod")}
	l, err := lw.List(metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pl := l.(*corev1.PodList)
	if len(pl.Items) != 1 || pl.ResourceVersion != "2" || pl.Items[0].ResourceVersion != "1" {
		t.Fatalf("list: %d items at %q (item at %q)", len(pl.Items), pl.ResourceVersion, pl.Items[0].ResourceVersion)
	}
	p1.Status.PodIP = "fd00:10::1" // the store holds a copy
	k2, p2 := storePod("b", "198.18.0.2")
	for _, err := range []error{s.put(k1, p1), s.put(k2, p2), s.remove(k1)} {
		if err != nil {
			t.Fatal(err)
		}
	}
	w, err := lw.Watch(metav1.ListOptions{ResourceVersion: pl.ResourceVersion})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	var got []string
	for range 3 {
		ev := <-w.ResultChan()
		p := ev.Object.(*corev1.Pod)
		got = append(got, fmt.Sprintf("%s %s %s@%s", ev.Type, p.Name, p.Status.PodIP, p.ResourceVersion))
	}
	want := []string{"MODIFIED a fd00:10::1@3", "ADDED b 198.18.0.2@4", "DELETED a fd00:10::1@5"}
	if !slices.Equal(got, want) {
		t.Errorf("replayed %q, want %q", got, want)
	}
	if err := s.put(nsKey, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "ns", Labels: map[string]string{"a": "b"}}}); err != nil {
		t.Fatal(err)
	}
	k3, p3 := storePod("c", "198.18.0.3")
	if err := s.put(k3, p3); err != nil {
		t.Fatal(err)
	}
	if ev := <-w.ResultChan(); ev.Type != watch.Added || ev.Object.(*corev1.Pod).Name != "c" {
		t.Errorf("followed %v %v, want the pod only", ev.Type, ev.Object)
	}
	if _, err := lw.Watch(metav1.ListOptions{ResourceVersion: "99"}); !apierrors.IsBadRequest(err) {
		t.Errorf("a future version: %v", err)
	}
	// Past the log's bound, the oldest events go: a watch from before them
	// is Gone (the informer lists again).
	for i := range maxStoreLog {
		if err := s.put(k3, p3); err != nil {
			t.Fatalf("put %d: %v", i, err)
		}
	}
	if _, err := lw.Watch(metav1.ListOptions{ResourceVersion: "2"}); !apierrors.IsResourceExpired(err) && !apierrors.IsGone(err) {
		t.Errorf("a compacted version: %v", err)
	}
}

// TestObjectStoreInformer: an informer over the store follows puts and
// removes, and one whose watch fell behind (its buffer full: ended) comes
// back to the same objects.
func TestObjectStoreInformer(t *testing.T) {
	s := newObjectStore()
	var inf cache.SharedIndexInformer
	for _, w := range s.informers() {
		if w.kind == "pod" {
			inf = w.informer
		}
	}
	if inf == nil {
		t.Fatal("no pod informer")
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { inf.RunWithContext(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		t.Fatal("not synced")
	}
	// More changes at once than a watch buffers (1,024): the watch is
	// ended, and the informer watches again from where it was.
	for i := range 3000 {
		k, p := storePod(fmt.Sprintf("p%d", i%1500), fmt.Sprintf("198.18.%d.%d", i/256%256, i%256))
		if err := s.put(k, p); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 500 {
		k, _ := storePod(fmt.Sprintf("p%d", i), "")
		if err := s.remove(k); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		keys := inf.GetStore().ListKeys()
		if len(keys) == 1000 && inf.LastSyncResourceVersion() == fmt.Sprint(s.rv) {
			o, ok, _ := inf.GetStore().GetByKey("ns/p1499")
			if !ok || o.(*corev1.Pod).Status.PodIP != fmt.Sprintf("198.18.%d.%d", 2999/256%256, 2999%256) {
				t.Fatalf("p1499: %v %v", ok, o)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("informer holds %d pods at %s, want 1000 at %d", len(keys), inf.LastSyncResourceVersion(), s.rv)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
