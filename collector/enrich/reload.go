package enrich

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/dualflow/dualflow/collector/enrich/inventory"
	"github.com/dualflow/dualflow/internal/reload"
)

// DefaultInventoryReload is how often the inventory source looks for
// changed manifest files.
const DefaultInventoryReload = 10 * time.Second

// inventorySource keeps the inventory files' objects in the store the
// informers list and watch (objectStore). A reload turns the difference
// between two loads into creates, updates and deletes, so the index
// follows a changed file through the same events as a cluster (deleted
// pods are kept for the grace period, addresses change hands, and so on).
type inventorySource struct {
	files   []string
	store   *objectStore
	objects map[objectKey]runtime.Object // as last loaded
	stamps  []reload.Stamp               // of the files when last read
	pending []reload.Stamp               // of changed files, seen once: read when seen again unchanged
	perFile map[string]int               // objects each file held when last loaded
}

type objectKey struct {
	gvr             schema.GroupVersionResource
	namespace, name string
}

// kindResources maps the inventory's kinds to their API resources.
var kindResources = func() map[string]schema.GroupVersionResource {
	m := map[string]schema.GroupVersionResource{}
	for _, k := range inventory.Kinds {
		m[k.Kind], _ = apimeta.UnsafeGuessKindToResource(k)
	}
	return m
}()

func keyOf(o *inventory.Object) (objectKey, error) {
	gvr, ok := kindResources[o.Kind]
	if !ok {
		return objectKey{}, fmt.Errorf("inventory %s: kind %s is not kept", o.Where(), o.Kind)
	}
	return objectKey{gvr: gvr, namespace: o.Namespace, name: o.Name}, nil
}

// newInventorySource loads res's objects into a new store.
func newInventorySource(files []string, stamps []reload.Stamp, res *inventory.Result) (*inventorySource, error) {
	s := &inventorySource{files: files, store: newObjectStore(), objects: map[objectKey]runtime.Object{}, stamps: stamps, perFile: countPerFile(res)}
	for i := range res.Objects {
		o := &res.Objects[i]
		k, err := keyOf(o)
		if err != nil {
			return nil, err
		}
		if err := s.store.put(k, o.Object); err != nil {
			return nil, fmt.Errorf("inventory %s: %w", o.Where(), err)
		}
		s.objects[k] = o.Object
	}
	return s, nil
}

// reloadResult says what a reload did.
type reloadResult struct {
	created, updated, deleted int
}

// errUnchanged is reload's answer when no file changed since the last
// read.
var errUnchanged = errors.New("inventory files unchanged")

// ErrEmptyInventoryFile is reload's answer when a file that held objects
// holds none now: most likely caught while being rewritten
// (`kubectl get -A -o yaml > file` truncates the file, then writes it
// seconds later), so nothing is deleted. Remove the file from
// --k8s.inventory to remove its objects.
var ErrEmptyInventoryFile = errors.New("inventory file has no objects now; keeping its objects (a file being rewritten?)")

func countPerFile(res *inventory.Result) map[string]int {
	m := map[string]int{}
	for i := range res.Objects {
		m[res.Objects[i].File]++
	}
	return m
}

// reload reads the files again if any changed since the last read and
// has not changed since the previous call (a file being written is not
// read half-way: an editor or a copy that truncates it first would
// otherwise delete objects for a moment), and applies the difference. A
// file that fails to load, or that held objects and is empty now (caught
// between the truncation and the write, however long the writer takes:
// ErrEmptyInventoryFile), leaves the objects as they were; it is not read
// again until it changes.
func (s *inventorySource) reload() (reloadResult, error) {
	stamps := reload.Stamps(s.files)
	if slices.Equal(stamps, s.stamps) {
		s.pending = nil
		return reloadResult{}, errUnchanged
	}
	if !slices.Equal(stamps, s.pending) {
		s.pending = stamps
		return reloadResult{}, errUnchanged
	}
	s.stamps, s.pending = stamps, nil
	res, err := inventory.Load(s.files...)
	if err != nil {
		return reloadResult{}, err
	}
	perFile := countPerFile(res)
	for _, f := range s.files {
		if s.perFile[f] > 0 && perFile[f] == 0 {
			return reloadResult{}, fmt.Errorf("%s (had %d): %w", f, s.perFile[f], ErrEmptyInventoryFile)
		}
	}
	s.perFile = perFile
	next := make(map[objectKey]runtime.Object, len(res.Objects))
	for i := range res.Objects {
		o := &res.Objects[i]
		k, err := keyOf(o)
		if err != nil {
			return reloadResult{}, err
		}
		next[k] = o.Object
	}
	var r reloadResult
	var errs []error
	for k, obj := range next {
		old, had := s.objects[k]
		switch {
		case !had:
			if err := s.store.put(k, obj); err != nil {
				errs = append(errs, err)
				continue
			}
			r.created++
		case !equality.Semantic.DeepEqual(old, obj):
			if err := s.store.put(k, obj); err != nil {
				errs = append(errs, err)
				continue
			}
			r.updated++
		}
		s.objects[k] = obj
	}
	for k := range s.objects {
		if _, keep := next[k]; keep {
			continue
		}
		if err := s.store.remove(k); err != nil {
			errs = append(errs, err)
			continue
		}
		delete(s.objects, k)
		r.deleted++
	}
	return r, errors.Join(errs...)
}
