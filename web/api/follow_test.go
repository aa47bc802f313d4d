package api

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// seqStore answers follow polls: the first poll one flow, then nothing.
type seqStore struct {
	mu    sync.Mutex
	polls int
	sqls  []string
	recv  int64 // time_received of the flow
}

func (s *seqStore) Query(_ context.Context, q, _ string) ([]byte, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.polls++
	s.sqls = append(s.sqls, q)
	if s.polls <= 2 { // the second poll sees the same row again (overlap)
		return []byte(`{"flow_end_ms":1000,"ip_version":6,"src_ip":"fd00:10::1","dst_ip":"fd00:10::2","protocol_name":"TCP","key":"7","time_received_ms":` + strconv.FormatInt(s.recv, 10) + `}` + "\n"), nil
	}
	return nil, nil
}

func TestFollowStreamsNewFlows(t *testing.T) {
	st := &seqStore{recv: time.Now().UnixMilli() + 60_000}
	a, err := New(Config{Store: st, FollowInterval: 20 * time.Millisecond, Anonymous: RoleOperator})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(a.Handler())
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", srv.URL+"/api/v1/flows?follow=true&ip_version=6&dst_ip=fd00:10::/32", nil)
	r, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Body.Close()
	if ct := r.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/event-stream") {
		t.Errorf("content type %q", ct)
	}
	sc := bufio.NewScanner(r.Body)
	var events []string
	for sc.Scan() && len(events) < 6 {
		if ev, ok := strings.CutPrefix(sc.Text(), "event:"); ok {
			events = append(events, ev)
		}
		if strings.HasPrefix(sc.Text(), "data:") && strings.Contains(sc.Text(), "fd00:10::2") {
			events = append(events, "data")
		}
		if id, ok := strings.CutPrefix(sc.Text(), "id:"); ok && id != strconv.FormatInt(st.recv, 10)+"-7" {
			t.Errorf("event id %q, want %d-7", id, st.recv)
		}
		if sc.Text() == "id:"+strconv.FormatInt(st.recv, 10)+"-7" {
			events = append(events, "id")
		}
	}
	if len(events) < 6 || events[0] != "id" || events[1] != "flow" || events[2] != "data" || events[3] != "heartbeat" || events[4] != "heartbeat" || events[5] != "heartbeat" {
		t.Errorf("events %v", events)
	}
	cancel()
	st.mu.Lock()
	defer st.mu.Unlock()
	// The second poll starts after the newest time_received seen, keeps
	// the filters, and never pages by flow_end.
	if len(st.sqls) < 2 || !strings.Contains(st.sqls[1], "time_received > fromUnixTimestamp64Milli("+strconv.FormatInt(st.recv-followOverlap.Milliseconds(), 10)+", 'UTC')") ||
		!strings.Contains(st.sqls[1], "ip_version = 6") || !strings.Contains(st.sqls[1], "dst_ip_bin BETWEEN") {
		t.Errorf("follow SQL %q", st.sqls)
	}
}

// sseEvent is one server-sent event of a follow stream.
type sseEvent struct{ id, event, data string }

// readEvents reads the events of stream r into ch until it ends.
func readEvents(r io.Reader, ch chan<- sseEvent) {
	defer close(ch)
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	var ev sseEvent
	for sc.Scan() {
		l := sc.Text()
		switch {
		case l == "":
			ch <- ev
			ev = sseEvent{}
		case strings.HasPrefix(l, "id:"):
			ev.id = l[3:]
		case strings.HasPrefix(l, "event:"):
			ev.event = l[6:]
		case strings.HasPrefix(l, "data:"):
			ev.data = l[5:]
		}
	}
}

// TestFollowResume: a follow stream resumed from an event id (as an
// EventSource reconnects, with Last-Event-ID) sends every flow of the
// store after that event exactly once, oldest first, across several
// batches, then follows; a bad id is a 400.
func TestFollowResume(t *testing.T) {
	e := needEngine(t)
	a, err := New(Config{Store: e, FollowInterval: 20 * time.Millisecond, Now: func() time.Time { return seedNow }, Anonymous: RoleOperator})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(a.Handler())
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	// The id of the flow received 5 minutes before the end of the seed
	// (about 1700 flows after it: several batches), and how many follow.
	const after = "time_received <= fromUnixTimestamp64Milli(%d, 'UTC')"
	out, err := e.Query(ctx, fmt.Sprintf("SELECT toUnixTimestamp64Milli(time_received), toString("+keyExpr+") FROM dualflow.flows WHERE "+after+
		" ORDER BY time_received DESC, "+keyExpr+" DESC LIMIT 1", seedNow.Add(-5*time.Minute).UnixMilli()), "TabSeparated")
	if err != nil {
		t.Fatal(err)
	}
	ms, key, _ := strings.Cut(strings.TrimSpace(string(out)), "\t")
	from := ms + "-" + key
	out, err = e.Query(ctx, "SELECT count() FROM dualflow.flows WHERE (toUnixTimestamp64Milli(time_received), "+keyExpr+") > ("+ms+", "+key+")", "TabSeparated")
	if err != nil {
		t.Fatal(err)
	}
	want, _ := strconv.Atoi(strings.TrimSpace(string(out)))
	if want <= followBatch {
		t.Fatalf("%d flows after %s: want more than a batch", want, from)
	}

	for _, how := range []string{"header", "parameter"} {
		t.Run(how, func(t *testing.T) {
			u := srv.URL + "/api/v1/flows?follow=true"
			req, _ := http.NewRequestWithContext(ctx, "GET", u, nil)
			if how == "header" {
				req.Header.Set("Last-Event-ID", from)
			} else {
				req.URL.RawQuery += "&last_event_id=" + from
			}
			r, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer r.Body.Close()
			ch := make(chan sseEvent, 16)
			go readEvents(r.Body, ch)
			prev, _ := parseEventID(from)
			got, heartbeats := 0, 0
			// Every flow, then heartbeats of polls with nothing new.
			for ev := range ch {
				switch ev.event {
				case "flow":
					id, err := parseEventID(ev.id)
					if err != nil || !id.after(prev) {
						t.Fatalf("flow %d: id %q after %v: not in order (%v)", got, ev.id, prev, err)
					}
					var fl Flow
					if err := json.Unmarshal([]byte(ev.data), &fl); err != nil || fl.TimeRecvMs != id.RecvMs {
						t.Fatalf("flow %d: %s (%v)", got, ev.data, err)
					}
					prev = id
					got++
					heartbeats = 0
				case "heartbeat":
					heartbeats++
				default:
					t.Fatalf("event %+v", ev)
				}
				if got >= want && heartbeats >= 3 {
					break
				}
			}
			go func() {
				for range ch { // until the body closes
				}
			}()
			if got != want {
				t.Errorf("resumed stream sent %d flows, want %d", got, want)
			}
		})
	}
	r := do(t, a.Handler(), "GET", "/api/v1/flows?follow=true", "", "Last-Event-ID", "yesterday")
	if e := decode[errorBody](t, r); r.code != 400 || e.Field != "Last-Event-ID" {
		t.Errorf("bad Last-Event-ID: %v", r)
	}
}
